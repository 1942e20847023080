// The Int8Linear operator's names and its descriptor (int8gemm_op.c).
#ifndef CV_ORTOP_H
#define CV_ORTOP_H

#include "op.h"

#define CV_INT8_DOMAIN CV_OP_DOMAIN
#define CV_INT8_OP "Int8Linear"

const void *cv_i8op_desc(void);

#endif

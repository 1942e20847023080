// The Int8Linear custom operator's names and its OrtCustomOp (ortop.c).
#ifndef CV_ORTOP_H
#define CV_ORTOP_H

#define CV_INT8_DOMAIN "com.conveyor"
#define CV_INT8_OP "Int8Linear"

const void *cv_i8op_custom_op(void);

#endif

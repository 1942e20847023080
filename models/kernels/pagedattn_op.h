// The PagedAttention operator's names and descriptors (pagedattn_op.c).
#ifndef CV_PA_ORTOP_H
#define CV_PA_ORTOP_H

#include "op.h"

#define CV_PA_DOMAIN CV_OP_DOMAIN
#define CV_PA_OP "PagedAttention"

const void *cv_paop_desc(int half);

#endif

// The PagedAttention custom operator's names and registration (ortop.c).
#ifndef CV_PA_ORTOP_H
#define CV_PA_ORTOP_H

#define CV_PA_DOMAIN "com.conveyor"
#define CV_PA_OP "PagedAttention"

char *cv_paop_register(const void *api, void *session_options, const void *const *others, int n);

#endif

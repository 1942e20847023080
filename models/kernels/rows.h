// Vector helpers of the sampler: the largest logit, and the sum (optionally the values)
// of exp((x - shift) * scale) over a row, with an AVX2+FMA path chosen at run time and a
// portable one. Masked logits (-Inf) give exactly 0.
#ifndef CONVEYOR_ROWS_H
#define CONVEYOR_ROWS_H

// cv_row_max returns the largest value of x[0..n), NaN if any value is NaN, -Inf for n == 0.
float cv_row_max(const float *x, long n);

// cv_row_find returns the first i with x[i] == v, or -1.
long cv_row_find(const float *x, long n, float v);

// cv_row_exp returns sum_i exp((x[i] - shift) * scale) in double precision and, when out
// is not NULL, stores each term in out[i]. The terms follow simd.h's exp rule: arguments
// below -87 (exp < 1.6e-38, -Inf included) count as 0, arguments above 88 as e^88; a NaN
// argument counts as 0.
double cv_row_exp(const float *x, float *out, long n, float shift, float scale);

// cv_row_isa is 1 when the AVX2 path runs, 0 for the portable one.
int cv_row_isa(void);

#endif

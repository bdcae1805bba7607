/*
 * test_expc.c: exp_c against the true exponential (accuracy), its edge cases as documented
 * in moet_expc.h, and silu_c's edge cases. (Exhaustive equality of vector versions with
 * this scalar reference is the job of each vector version's own test.)
 */
#include <math.h>
#include <stdint.h>

#include "moet_expc.h"
#include "moet_test.h"

static double ulp_err(float got, double want)
{
	if (want == 0.0)
		return got == 0.0f ? 0.0 : INFINITY;
	int e;
	frexp(want, &e);
	double ulp = ldexp(1.0, (e - 24) < -149 ? -149 : (e - 24));
	return fabs((double)got - want) / ulp;
}

int main(void)
{
	double worst = 0;
	float worst_x = 0;
	/* Every float in the finite, normal-result range, stepping through the bit patterns. */
	for (uint64_t u = 0; u < 0x100000000ull; u += 4099) {
		float x = moet_bits_f32((uint32_t)u);
		if (!(x > -87.0f && x < 88.0f))
			continue;
		double e = ulp_err(moet_exp_c(x), exp((double)x));
		if (e > worst) {
			worst = e;
			worst_x = x;
		}
	}
	CHECK(worst <= 2.0, "exp_c worst error %.3f ulp at x=%a", worst, worst_x);
	printf("exp_c: worst error %.3f ulp (x=%a)\n", worst, worst_x);

	CHECK(isnan(moet_exp_c(NAN)), "exp_c(NaN) is not NaN");
	CHECK(moet_exp_c(INFINITY) == INFINITY, "exp_c(+inf)");
	CHECK(moet_exp_c(-INFINITY) == 0.0f && !signbit(moet_exp_c(-INFINITY)), "exp_c(-inf)");
	CHECK(moet_exp_c(89.5f) == INFINITY, "exp_c(89.5) should overflow");
	CHECK(moet_exp_c(88.8f) == INFINITY, "exp_c(88.8) should overflow");
	CHECK(isfinite(moet_exp_c(88.7f)), "exp_c(88.7) should be finite");
	CHECK(moet_exp_c(0.0f) == 1.0f && moet_exp_c(-0.0f) == 1.0f, "exp_c(0)");
	CHECK(moet_exp_c(-200.0f) == 0.0f, "exp_c(-200)");
	/* gradual underflow: subnormal results within 1 subnormal ulp */
	for (float x = -103.9f; x < -87.5f; x += 0.37f) {
		double want = exp((double)x);
		float got = moet_exp_c(x);
		CHECK(fabs((double)got - want) <= 0x1p-149 + want * 0x1p-22, "exp_c(%a)=%a want %a",
		      x, got, want);
	}
	CHECK(moet_silu_c(0.0f) == 0.0f, "silu(0)");
	CHECK(moet_silu_c(INFINITY) == INFINITY, "silu(+inf)");
	CHECK(moet_silu_c(-100.0f) == 0.0f, "silu(-100) = -0");
	CHECK(fabs(moet_silu_c(1.0f) - 1.0 / (1.0 + exp(-1.0))) < 1e-7, "silu(1)");
	return moet_test_done("test_expc");
}

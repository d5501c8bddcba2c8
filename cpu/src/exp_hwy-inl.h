// exp(x) for the softmax of the f32 attention kernels (decode and prefill),
// where x = s - max <= 0. Highway's Exp is general (its own range reduction,
// overflow guards, an extra multiply to scale): about 30 instructions per vector on
// AVX2, the third of a prefill tile's time at head_dim 32 (Zen 3). This one
// takes 14:
//   n = round(x log2 e)                 adding 1.5 * 2^23 rounds to an integer
//   r = x - n ln2                       ln2 in two parts (Cody-Waite): n ln2_hi exact
//   exp(r) = 1 + r + r^2 (c2 + ... + c6 r^4)     on |r| <= ln2 / 2, Horner
//   exp(x) = exp(r) 2^n                 n added to the exponent bits
// The coefficients are a minimax fit of the relative error with the first two
// terms fixed to 1 (3.1e-9 before rounding). Over 5 million arguments in
// [-86, 0] the result was within 7.4e-8 of exp in fp64 where the target has
// FMA, 9.6e-8 where it does not (SSE4): under 2^-23, the 1 ulp that the
// kernels' error bounds assume (tests/cpu: F32SoftmaxExpIsWithin1Ulp...).
// Below -86 (where 2^n would leave the normal range) the result is 0: such
// terms weigh less than 1e-37 next to the row's maximum, whose exp is 1. So
// it is for -inf (masked scores) and NaN, as with Highway's Exp.
//
// Include after hwy/highway.h, outside any namespace, in a file compiled per
// target (foreach_target.h).
#if defined(LONGCTX_CPU_EXP_HWY_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef LONGCTX_CPU_EXP_HWY_INL_H_
#undef LONGCTX_CPU_EXP_HWY_INL_H_
#else
#define LONGCTX_CPU_EXP_HWY_INL_H_
#endif

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace longctx::cpu::HWY_NAMESPACE {

// exp(x) for x <= 0 (see above); 0 below -86.
template <class D, class V = hwy::HWY_NAMESPACE::Vec<D>>
HWY_INLINE V ExpNonPositive(D d, V x) {
  namespace hn = hwy::HWY_NAMESPACE;
  const hn::RebindToSigned<D> di;
  const V round_shift = hn::Set(d, 12582912.f);  // 1.5 * 2^23: the sum's last bit is worth 1
  const V shifted = hn::MulAdd(x, hn::Set(d, 1.44269504f), round_shift);
  const V n = hn::Sub(shifted, round_shift);
  V r = hn::MulAdd(n, hn::Set(d, -0.693359375f), x);  // ln2_hi: 9 significant bits
  r = hn::MulAdd(n, hn::Set(d, 2.12194440e-4f), r);    // -ln2_lo = ln2_hi - ln2
  V p = hn::Set(d, 1.38145965e-3f);
  p = hn::MulAdd(p, r, hn::Set(d, 8.36871751e-3f));
  p = hn::MulAdd(p, r, hn::Set(d, 4.16683890e-2f));
  p = hn::MulAdd(p, r, hn::Set(d, 1.66665211e-1f));
  p = hn::MulAdd(p, r, hn::Set(d, 4.99999940e-1f));
  p = hn::MulAdd(p, r, hn::Set(d, 1.f));
  p = hn::MulAdd(p, r, hn::Set(d, 1.f));
  // n sits in the low bits of `shifted`; shifted left into the exponent
  // field (the bits above wrap away) it multiplies p by 2^n.
  const auto scaled = hn::Add(hn::BitCast(di, p), hn::ShiftLeft<23>(hn::BitCast(di, shifted)));
  return hn::IfThenElseZero(hn::Ge(x, hn::Set(d, -86.f)), hn::BitCast(d, scaled));
}

}  // namespace longctx::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // LONGCTX_CPU_EXP_HWY_INL_H_

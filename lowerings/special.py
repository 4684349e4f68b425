"""Lowerings: special functions (Bessel, Airy, gamma family, orthogonal polynomials) and prims.

The Bessel, Airy and polynomial lowerings port PyTorch's own CPU kernels (ATen/native/Math.h,
after Cephes): same coefficients, branches and special values, so they agree to rounding. The
``prims.*`` ops are what PyTorch's decompositions of ``special_*``, ``igamma``, ``lcm``, shifts and
friends emit.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import jax.scipy.special as jsp
import numpy as np
from jax import lax

# Shared with the elementwise table: compute-dtype casts, the result cast and pointwise registration.
from lowerings.elementwise import (
    _digamma,
    _names,
    _operands,
    _register_pointwise,
    _result,
    shift_left,
    shift_right,
)
from lowerings.registry import lowering

_SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
_FRAC_1_SQRT_PI = 1 / math.sqrt(math.pi)


def _tables(text: str) -> dict[str, tuple[float, ...]]:
    """Coefficient tables written as ``NAME c0 c1 ...``; Cephes order (highest degree first)."""
    tables: dict[str, list[float]] = {}
    for token in text.split():
        if token[0].isalpha():
            name = token
            tables[name] = []
        else:
            tables[name].append(float(token))
    return {name: tuple(values) for name, values in tables.items()}


def _polevl(x: Any, coefficients: tuple[float, ...]) -> Any:
    """Horner's rule, highest degree first (Cephes' polevl)."""
    acc = jnp.full_like(x, coefficients[0])
    for c in coefficients[1:]:
        acc = acc * x + c
    return acc


def _chbevl(x: Any, coefficients: tuple[float, ...]) -> Any:
    """Clenshaw's sum of a Chebyshev series (Cephes' chbevl)."""
    b0, b1, b2 = jnp.full_like(x, coefficients[0]), jnp.zeros_like(x), jnp.zeros_like(x)
    for c in coefficients[1:]:
        b2, b1 = b1, b0
        b0 = x * b1 - b2 + c
    return 0.5 * (b0 - b2)


def _first_of(default: Any, *cases: tuple[Any, Any]) -> Any:
    """The value of the first ``(mask, value)`` case whose mask holds, else ``default``: a C
    if-return chain, elementwise."""
    out = default
    for mask, value in reversed(cases):
        out = jnp.where(mask, value, out)
    return out


# --- coefficient tables (PyTorch's ATen/native/Math.h) ---------------------------------------

_AIRY = _tables(
    """
    AN  3.46538101525629032477e-1 1.20075952739645805542e1 7.62796053615234516538e1
        1.68089224934630576269e2 1.59756391350164413639e2 7.05360906840444183113e1
        1.40264691163389668864e1 9.99999999999999995305e-1
    AD  5.67594532638770212846e-1 1.47562562584847203173e1 8.45138970141474626562e1
        1.77318088145400459522e2 1.64234692871529701831e2 7.14778400825575695274e1
        1.40959135607834029598e1 1.00000000000000000470e0
    AFN -1.31696323418331795333e-1 -6.26456544431912369773e-1 -6.93158036036933542233e-1
        -2.79779981545119124951e-1 -4.91900132609500318020e-2 -4.06265923594885404393e-3
        -1.59276496239262096340e-4 -2.77649108155232920844e-6 -1.67787698489114633780e-8
    AFD 1.33560420706553243746e1 3.26825032795224613948e1 2.67367040941499554804e1
        9.18707402907259625840e0 1.47529146771666414581e0 1.15687173795188044134e-1
        4.40291641615211203805e-3 7.54720348287414296618e-5 4.51850092970580378464e-7
    AGN 1.97339932091685679179e-2 3.91103029615688277255e-1 1.06579897599595591108e0
        9.39169229816650230044e-1 3.51465656105547619242e-1 6.33888919628925490927e-2
        5.85804113048388458567e-3 2.82851600836737019778e-4 6.98793669997260967291e-6
        8.11789239554389293311e-8 3.41551784765923618484e-10
    AGD 9.30892908077441974853e0 1.98352928718312140417e1 1.55646628932864612953e1
        5.47686069422975497931e0 9.54293611618961883998e-1 8.64580826352392193095e-2
        4.12656523824222607191e-3 1.01259085116509135510e-4 1.17166733214413521882e-6
        4.91834570062930015649e-9
    """
)
_J0 = _tables(
    """
    PP  7.96936729297347051624e-4 8.28352392107440799803e-2 1.23953371646414299388e0
        5.44725003058768775090e0 8.74716500199817011941e0 5.30324038235394892183e0
        9.99999999999999997821e-1
    PQ  9.24408810558863637013e-4 8.56288474354474431428e-2 1.25352743901058953537e0
        5.47097740330417105182e0 8.76190883237069594232e0 5.30605288235394617618e0
        1.00000000000000000218e0
    QP  -1.13663838898469149931e-2 -1.28252718670509318512e0 -1.95539544257735972385e1
        -9.32060152123768231369e1 -1.77681167980488050595e2 -1.47077505154951170175e2
        -5.14105326766599330220e1 -6.05014350600728481186e0
    QQ  6.43178256118178023184e1 8.56430025976980587198e2 3.88240183605401609683e3
        7.24046774195652478189e3 5.93072701187316984827e3 2.06209331660327847417e3
        2.42005740240291393179e2
    RP  -4.79443220978201773821e9 1.95617491946556577543e12 -2.49248344360967716204e14
        9.70862251047306323952e15
    RQ  4.99563147152651017219e2 1.73785401676374683123e5 4.84409658339962045305e7
        1.11855537045356834862e10 2.11277520115489217587e12 3.10518229857422583814e14
        3.18121955943204943306e16 1.71086294081043136091e18
    """
)
_J1 = _tables(
    """
    PP  7.62125616208173112003e-4 7.31397056940917570436e-2 1.12719608129684925192e0
        5.11207951146807644818e0 8.42404590141772420927e0 5.21451598682361504063e0
        1.00000000000000000254e0
    PQ  5.71323128072548699714e-4 6.88455908754495404082e-2 1.10514232634061696926e0
        5.07386386128601488557e0 8.39985554327604159757e0 5.20982848682361821619e0
        9.99999999999999997461e-1
    QP  5.10862594750176621635e-2 4.98213872951233449420e0 7.58238284132545283818e1
        3.66779609360150777800e2 7.10856304998926107277e2 5.97489612400613639965e2
        2.11688757100572135698e2 2.52070205858023719784e1
    QQ  7.42373277035675149943e1 1.05644886038262816351e3 4.98641058337653607651e3
        9.56231892404756170795e3 7.99704160447350683650e3 2.82619278517639096600e3
        3.36093607810698293419e2
    RP  -8.99971225705559398224e8 4.52228297998194034323e11 -7.27494245221818276015e13
        3.68295732863852883286e15
    RQ  6.20836478118054335476e2 2.56987256757748830383e5 8.35146791431949253037e7
        2.21511595479792499675e10 4.74914122079991414898e12 7.84369607876235854894e14
        8.95222336184627338078e16 5.32278620332680085395e18
    """
)
_Y0 = _tables(
    """
    YP  1.55924367855235737965e4 -1.46639295903971606143e7 5.43526477051876500413e9
        -9.82136065717911466409e11 8.75906394395366999549e13 -3.46628303384729719441e15
        4.42733268572569800351e16 -1.84950800436986690637e16
    YQ  1.04128353664259848412e3 6.26107330137134956842e5 2.68919633393814121987e8
        8.64002487103935000337e10 2.02979612750105546709e13 3.17157752842975028269e15
        2.50596256172653059228e17
    """
)
_Y1 = _tables(
    """
    YP  1.26320474790178026440e9 -6.47355876379160291031e11 1.14509511541823727583e14
        -8.12770255501325109621e15 2.02439475713594898196e17 -7.78877196265950026825e17
    YQ  5.94301592346128195359e2 2.35564092943068577943e5 7.34811944459721705660e7
        1.87601316108706159478e10 3.88231277496238566008e12 6.20557727146953693363e14
        6.87141087355300489866e16 3.97270608116560655612e18
    """
)
_K0 = _tables(
    """
    A   1.37446543561352307156e-16 4.25981614279661018399e-14 1.03496952576338420167e-11
        1.90451637722020886025e-9 2.53479107902614945675e-7 2.28621210311945178607e-5
        1.26461541144692592338e-3 3.59799365153615016266e-2 3.44289899924628486886e-1
        -5.35327393233902768720e-1
    B   5.30043377268626276149e-18 -1.64758043015242134646e-17 5.21039150503902756861e-17
        -1.67823109680541210385e-16 5.51205597852431940784e-16 -1.84859337734377901440e-15
        6.34007647740507060557e-15 -2.22751332699166985548e-14 8.03289077536357521100e-14
        -2.98009692317273043925e-13 1.14034058820847496303e-12 -4.51459788337394416547e-12
        1.85594911495471785253e-11 -7.95748924447710747776e-11 3.57739728140030116597e-10
        -1.69753450938905987466e-9 8.57403401741422608519e-9 -4.66048989768794782956e-8
        2.76681363944501510342e-7 -1.83175552271911948767e-6 1.39498137188764993662e-5
        -1.28495495816278026384e-4 1.56988388573005337491e-3 -3.14481013119645005427e-2
        2.44030308206595545468e0
    """
)
_K1 = _tables(
    """
    A   -7.02386347938628759343e-18 -2.42744985051936593393e-15 -6.66690169419932900609e-13
        -1.41148839263352776110e-10 -2.21338763073472585583e-8 -2.43340614156596823496e-6
        -1.73028895751305206302e-4 -6.97572385963986435018e-3 -1.22611180822657148235e-1
        -3.53155960776544875667e-1 1.52530022733894777053e0
    B   -5.75674448366501715755e-18 1.79405087314755922667e-17 -5.68946255844285935196e-17
        1.83809354436663880070e-16 -6.05704724837331885336e-16 2.03870316562433424052e-15
        -7.01983709041831346144e-15 2.47715442448130437068e-14 -8.97670518232499435011e-14
        3.34841966607842919884e-13 -1.28917396095102890680e-12 5.13963967348173025100e-12
        -2.12996783842756842877e-11 9.21831518760500529508e-11 -4.19035475934189648750e-10
        2.01504975519703286596e-9 -1.03457624656780970260e-8 5.74108412545004946722e-8
        -3.50196060308781257119e-7 2.40648494783721712015e-6 -1.93619797416608296024e-5
        1.95215518471351631108e-4 -2.85781685962277938680e-3 1.03923736576817238437e-1
        2.72062619048444266945e0
    """
)
_TEMME = _tables(
    """
    D0  -3.3333333333333333e-1 8.3333333333333333e-2 -1.4814814814814815e-2
        1.1574074074074074e-3 3.527336860670194e-4 -1.7875514403292181e-4
        3.9192631785224378e-5 -2.1854485106799922e-6 -1.85406221071516e-6
        8.296711340953086e-7
    D1  -1.8518518518518519e-3 -3.4722222222222222e-3 2.6455026455026455e-3
        -9.9022633744855967e-4 2.0576131687242798e-4 -4.0187757201646091e-7
        -1.8098550334489978e-5 7.6491609160811101e-6 -1.6120900894563446e-6
        4.6471278028074343e-9
    D2  4.1335978835978836e-3 -2.6813271604938272e-3 7.7160493827160494e-4
        2.0093878600823045e-6 -1.0736653226365161e-4 5.2923448829120125e-5
        -1.2760635188618728e-5 3.4235787340961381e-8 1.3721957309062933e-6
        -6.298992138380055e-7
    D3  6.4943415637860082e-4 2.2947209362139918e-4 -4.6918949439525571e-4
        2.6772063206283885e-4 -7.5618016718839764e-5 -2.3965051138672967e-7
        1.1082654115347302e-5 -5.6749528269915966e-6 1.4230900732435884e-6
        -2.7861080291528142e-11
    """
)


# --- Airy and Bessel functions ---------------------------------------------------------------

# Terms of Ai's Maclaurin series: PyTorch sums to float epsilon; for |x| < 2.09 ten terms reach
# float64's.
_AIRY_SERIES_TERMS = 10


def _airy_ai(x):
    t = _AIRY
    root = jnp.sqrt(jnp.abs(x))
    zeta = 2 * jnp.abs(x) * root / 3
    zz = 1 / (zeta * zeta)
    f = 1 + zz * _polevl(zz, t["AFN"]) / _polevl(zz, t["AFD"])
    g = _polevl(zz, t["AGN"]) / (zeta * _polevl(zz, t["AGD"]))
    theta = zeta + math.pi / 4
    oscillating = _FRAC_1_SQRT_PI / jnp.sqrt(root) * (jnp.sin(theta) * f - jnp.cos(theta) * g)
    ratio = _polevl(1 / zeta, t["AN"]) / _polevl(1 / zeta, t["AD"])
    decaying = _FRAC_1_SQRT_PI * ratio / (2 * jnp.sqrt(root) * jnp.exp(zeta))
    z = x * x * x
    f, g, m, n = jnp.ones_like(x), x, jnp.ones_like(x), x
    for i in range(_AIRY_SERIES_TERMS):
        k = 3 * i + 1
        m = m * z / (k + 1) / (k + 2)
        n = n * z / (k + 2) / (k + 3)
        f, g = f + m, g + n
    series = 0.355028053887817239260 * f - 0.258819403792806798405 * g
    return _first_of(
        series,
        (jnp.isinf(x), jnp.nan),
        (x > 103.892, 0),
        (x < -2.09, oscillating),
        (x >= 2.09, decaying),
    )


def _hankel(x, t, phase, second_kind):
    """The large-x form of J (or Y, ``second_kind``) from Cephes' P and Q rational functions."""
    w = 5 / x
    z = w * w
    p = _polevl(z, t["PP"]) / _polevl(z, t["PQ"])
    q = w * _polevl(z, t["QP"]) / _polevl(z, t["QQ"])
    s, c = jnp.sin(x - phase), jnp.cos(x - phase)
    wave = p * s + q * c if second_kind else p * c - q * s
    return wave * _SQRT_2_OVER_PI / jnp.sqrt(x)


def _bessel_j0(x):
    x = jnp.abs(x)
    xx = x * x
    rational = _polevl(xx, _J0["RP"]) / _polevl(xx, _J0["RQ"])
    small = (xx - 5.78318596294678452118) * (xx - 30.4712623436620863991) * rational
    large = _hankel(x, _J0, math.pi / 4, second_kind=False)
    return _first_of(large, (x < 1e-5, 1 - xx / 4), (x <= 5, small))


def _bessel_j1(x):
    xx = x * x
    rational = _polevl(xx, _J1["RP"]) / _polevl(xx, _J1["RQ"])
    small = rational * x * (xx - 14.6819706421238932572) * (xx - 49.2184563216946036703)
    large = _hankel(jnp.abs(x), _J1, 3 * math.pi / 4, second_kind=False)
    return jnp.where(jnp.abs(x) <= 5, small, jnp.where(x < 0, -large, large))


def _bessel_y0(x):
    xx = x * x
    small = _polevl(xx, _Y0["YP"]) / _polevl(xx, _Y0["YQ"])
    small = small + 2 / math.pi * jnp.log(x) * _bessel_j0(x)
    large = _hankel(x, _J0, math.pi / 4, second_kind=True)
    return _first_of(large, (x == 0, -jnp.inf), (x < 0, jnp.nan), (x <= 5, small))


def _bessel_y1(x):
    xx = x * x
    small = x * (_polevl(xx, _Y1["YP"]) / _polevl(xx, _Y1["YQ"]))
    small = small + 2 / math.pi * (_bessel_j1(x) * jnp.log(x) - 1 / x)
    large = _hankel(x, _J1, 3 * math.pi / 4, second_kind=True)
    return _first_of(large, (x == 0, -jnp.inf), (x < 0, jnp.nan), (x <= 5, small))


def _bessel_i0(x):
    return jnp.exp(jnp.abs(x)) * lax.bessel_i0e(x)


def _bessel_i1(x):
    return jnp.exp(jnp.abs(x)) * lax.bessel_i1e(x)


def _bessel_k(order, scaled):
    """K0 or K1 (times e^x when ``scaled``): a Chebyshev series in x^2 up to 2, in 8/x beyond."""
    t, bessel_i = (_K0, _bessel_i0) if order == 0 else (_K1, _bessel_i1)

    def fn(x):
        series = _chbevl(x * x - 2, t["A"])
        log_term = jnp.log(0.5 * x) * bessel_i(x)
        small = series - log_term if order == 0 else log_term + series / x
        large = _chbevl(8 / x - 2, t["B"]) / jnp.sqrt(x)
        if scaled:
            small = small * jnp.exp(x)
        else:
            large = large * jnp.exp(-x)
        return _first_of(large, (x == 0, jnp.inf), (x < 0, jnp.nan), (x <= 2, small))

    return fn


# sin(x)/x's Maclaurin series, used below |x| = 0.5.
_SINC_SERIES = (1 / 6227020800, -1 / 39916800, 1 / 362880, -1 / 5040, 1 / 120, -1 / 6, 1)


def _spherical_bessel_j0(x):
    series = _polevl(x * x, _SINC_SERIES)
    return _first_of(jnp.sin(x) / x, (jnp.isinf(x), 0), (jnp.abs(x) < 0.5, series))


# --- error function, gamma family ------------------------------------------------------------


def _erfcx_asymptotic_series(terms):
    """erfcx(x) * x * sqrt(pi) as a polynomial in 1/x^2: sum of (-1)^k (2k-1)!! / (2x^2)^k."""
    c = [1.0]
    for k in range(1, terms):
        c.append(-c[-1] * (2 * k - 1) / 2)
    return tuple(reversed(c))


_ERFCX_SERIES = _erfcx_asymptotic_series(9)


def _erfcx(x):
    # exp(x^2) * erfc(x) until erfc(x) would leave the normal range (XLA flushes subnormals to
    # zero, which jax.scipy.special.erfcx runs into), the asymptotic series beyond.
    switch = math.sqrt(-math.log(jnp.finfo(x.dtype).tiny)) - 0.5
    large = x > switch
    safe = jnp.where(large, 0, x)
    direct = jnp.exp(safe * safe) * lax.erfc(safe)
    asymptotic = _polevl(1 / (x * x), _ERFCX_SERIES) * _FRAC_1_SQRT_PI / x
    return jnp.where(large, asymptotic, direct)


def _trigamma(x):
    reflect = x < 0.5
    sin_pi_x = jnp.sin(math.pi * x)
    acc = jnp.where(reflect, -(math.pi * math.pi) / (sin_pi_x * sin_pi_x), 0)
    y = jnp.where(reflect, 1 - x, x)
    for _ in range(6):
        acc = acc + 1 / (y * y)
        y = y + 1
    ixx = 1 / (y * y)
    acc = acc + (1 + 1 / (2 * y) + ixx * (1 / 6 - ixx * (1 / 30 - ixx * (1 / 42)))) / y
    return jnp.where(reflect, -acc, acc)


def _is_integral_value(x):
    return x == jnp.floor(x)


_ZETA_HUGE_X = math.exp(math.log(np.finfo(np.float64).max) / 23)


def _zeta(x, q):
    """Hurwitz zeta with PyTorch's domain rules, in float64 as PyTorch's CPU kernel accumulates
    (cancellation at negative q needs it). XLA's series assumes q + 9 > 0, so a negative q is
    first moved up by whole steps: zeta(x, q) = q^-x + zeta(x, q + 1)."""
    dtype = x.dtype
    x, q = x.astype(np.float64), q.astype(np.float64)
    pole = (q <= 0) & _is_integral_value(q)
    undefined = (x < 1) | ((q <= 0) & ~_is_integral_value(x))
    # Past x = DBL_MAX^(1/23), PyTorch's Euler-Maclaurin tail overflows to NaN (for q > 1); XLA's
    # series gives NaN too early for q <= 1, whose leading term q^-x is the value there.
    huge = jnp.where(q == 1, 1, jnp.where(q < 1, jnp.inf, jnp.nan))
    q = jnp.where(pole | undefined, 1, q)

    def step(state):
        q, acc = state
        live = q < 0
        return jnp.where(live, q + 1, q), jnp.where(live, acc + q**-x, acc)

    q, acc = lax.while_loop(lambda s: jnp.any(s[0] < 0), step, (q, jnp.zeros_like(q)))
    value = _first_of(
        lax.zeta(x, q) + acc,
        (x == 1, jnp.inf),
        (x < 1, jnp.nan),
        (pole, jnp.inf),
        (undefined, jnp.nan),
        (x > _ZETA_HUGE_X, huge),
    )
    return value.astype(dtype)


def _polygamma(n, x):
    if n == 0:
        return _digamma(x)
    if n == 1:
        return _trigamma(x)
    factorial = jnp.exp(lax.lgamma(jnp.full((), n + 1, x.dtype)))
    return (1 if n % 2 else -1) * factorial * _zeta(jnp.full_like(x, n + 1), x)


# PyTorch evaluates the incomplete gamma functions by the uniform asymptotic expansion (DLMF 8.12)
# for a > 200 near x = a; XLA's series lose float32 accuracy there and never end once a + 1 == a.
# Four terms of it in a, each coefficient to eta^9, stay far below float32 rounding for a > 200.
_IGAMMA_ASYMPTOTIC_A = 200


def _igamma_asymptotic(a, x, upper):
    sigma = (x - a) / a
    eta = jnp.sign(sigma) * jnp.sqrt(jnp.maximum(-2 * (jnp.log1p(sigma) - sigma), 0))
    sign = 1 if upper else -1
    # Beyond |eta| = 1 the exponential below is < e^-100: clipping only keeps the sum finite.
    eta_c = jnp.clip(eta, -1, 1)
    total, scale = jnp.zeros_like(a), jnp.ones_like(a)
    for row in _TEMME.values():
        total = total + _polevl(eta_c, row[::-1]) * scale
        scale = scale / a
    tail = jnp.exp(-0.5 * a * eta * eta) * total / jnp.sqrt(2 * math.pi * a)
    return 0.5 * lax.erfc(sign * eta * jnp.sqrt(a / 2)) + sign * tail


def _incomplete_gamma(upper):
    """Regularized lower (or upper) incomplete gamma, with PyTorch's (SciPy's) boundary values."""
    series = lax.igammac if upper else lax.igamma
    at_zero, at_inf = (1, 0) if upper else (0, 1)

    def fn(a, x):
        asymptotic = a > _IGAMMA_ASYMPTOTIC_A
        boundary = (a <= 0) | (x <= 0) | jnp.isinf(a) | jnp.isinf(x)
        safe = asymptotic | boundary
        value = series(jnp.where(safe, 1, a), jnp.where(safe, 1, x))
        value = jnp.where(asymptotic, _igamma_asymptotic(a, x, upper), value)
        return _first_of(
            value,
            ((x < 0) | (a < 0), jnp.nan),
            (a == 0, jnp.where(x > 0, at_inf, jnp.nan)),
            (x == 0, at_zero),
            (jnp.isinf(a), jnp.where(jnp.isinf(x), jnp.nan, at_zero)),
            (jnp.isinf(x), at_inf),
        )

    return fn


# --- integer prims ---------------------------------------------------------------------------


def _gcd(a, b):
    # Euclid with C's remainder, as PyTorch (jnp.gcd's floor remainder never ends on INT64_MIN).
    def step(state):
        a, b = state
        live = a != 0
        return jnp.where(live, lax.rem(b, jnp.where(live, a, 1)), a), jnp.where(live, a, b)

    a, b = jnp.broadcast_arrays(jnp.abs(a), jnp.abs(b))
    return lax.while_loop(lambda s: jnp.any(s[0] != 0), step, (a, b))[1]


def _broadcasting(fn):
    return lambda a, b: fn(*jnp.broadcast_arrays(a, b))


# --- orthogonal polynomials ------------------------------------------------------------------


def _integral_degree(n):
    """The degree as PyTorch's kernels read it: truncated to int64, where NaN, infinities and
    values out of range become INT64_MIN (x86's conversion), a negative degree."""
    n = jnp.trunc(n)
    return jnp.where(jnp.abs(n) < 2.0**63, n, -1)


def _alternating(n, value):
    """(-1)^n * value."""
    return jnp.where(jnp.fmod(n, 2) == 0, value, -value)


def _recurrence(n, first, step):
    """P_n from P_0 = 1, P_1 = ``first`` and P_(j+1) = step(j, P_(j-1), P_j), in every lane with
    n >= 1; a lane stops once it is NaN, as PyTorch's loops do (its value stays NaN)."""

    def live(j, q):
        return (j < n) & ~jnp.isnan(q)

    def body(state):
        j, p, q = state
        go = live(j, q)
        return j + 1, jnp.where(go, q, p), jnp.where(go, step(j, p, q), q)

    init = (jnp.ones((), first.dtype), jnp.ones_like(first), first)
    return lax.while_loop(lambda s: jnp.any(live(s[0], s[2])), body, init)[2]


def _chebyshev_u_closed(y, n, theta):
    s = jnp.sin(theta)
    return jnp.where(s != 0, jnp.sin((n + 1) * theta) / s, (n + 1) * jnp.cos((n + 1) * theta) / y)


def _chebyshev_v_closed(y, n, theta):
    ratio = jnp.cos((n + 0.5) * theta) / jnp.cos(theta / 2)
    return jnp.where(jnp.sin(theta / 2) != 1, ratio, _alternating(n, n + n + 1))


def _chebyshev_w_closed(y, n, theta):
    ratio = jnp.sin((n + 0.5) * theta) / jnp.sin(theta / 2)
    at_one = jnp.where(y > 0, n + n + 1, _alternating(n, jnp.ones_like(n)))
    return jnp.where(jnp.cos(theta / 2) != 1, ratio, at_one)


# kind -> (P_1(y), P_n(1), P_n(-1), P_n(cos theta) in closed form); all share the recurrence
# P_(j+1) = 2y P_j - P_(j-1).
_CHEBYSHEV_KINDS = {
    "t": (
        lambda y: y,
        lambda n: jnp.ones_like(n),
        lambda n: _alternating(n, jnp.ones_like(n)),
        lambda y, n, theta: jnp.cos(n * theta),
    ),
    "u": (
        lambda y: y + y,
        lambda n: n + 1,
        lambda n: _alternating(n, n + 1),
        _chebyshev_u_closed,
    ),
    "v": (
        lambda y: y + y - 1,
        lambda n: jnp.ones_like(n),
        lambda n: _alternating(n, n + n + 1),
        _chebyshev_v_closed,
    ),
    "w": (
        lambda y: y + y + 1,
        lambda n: n + n + 1,
        lambda n: _alternating(n, jnp.ones_like(n)),
        _chebyshev_w_closed,
    ),
}


def _chebyshev(kind, shifted, closed_above):
    """Chebyshev polynomials of ``kind`` (of 2x - 1 when ``shifted``); PyTorch switches from the
    recurrence to the closed form on (-1, 1) for degrees above ``closed_above``."""
    first, at_one, at_minus_one, closed = _CHEBYSHEV_KINDS[kind]

    def fn(x, n):
        n = _integral_degree(n)
        y = x + x - 1 if shifted else x
        on_edge = jnp.abs(y) == 1
        inside = (jnp.abs(y) < 1) & (n > closed_above)
        looped = _recurrence(
            jnp.where(on_edge | inside, 0, n), first(y), lambda j, p, q: (y + y) * q - p
        )
        return _first_of(
            looped,
            (n < 0, 0),
            (y == 1, at_one(n)),
            (y == -1, at_minus_one(n)),
            (inside, closed(y, n, jnp.arccos(y))),
            (n == 0, 1),
            (n == 1, first(y)),
        )

    return fn


def _hermite(physicists):
    """Hermite polynomials H_n (``physicists``) or He_n; PyTorch gives NaN past a degree limit."""

    def fn(x, n):
        n = _integral_degree(n)
        limit = 512 if x.dtype == np.dtype(np.float64) else 128
        if physicists:
            first, step = x + x, lambda j, p, q: (x + x) * q - (j + j) * p
        else:
            first, step = x, lambda j, p, q: x * q - j * p
        looped = _recurrence(jnp.where(n > limit, 0, n), first, step)
        return _first_of(looped, (n < 0, 0), (n == 0, 1), (n == 1, first), (n > limit, jnp.nan))

    return fn


def _laguerre(x, n):
    n = _integral_degree(n)
    looped = _recurrence(
        jnp.where(x == 0, 0, n), 1 - x, lambda j, p, q: ((j + j + (1 - x)) * q - j * p) / (j + 1)
    )
    return _first_of(looped, (n < 0, 0), (x == 0, 1), (n == 0, 1), (n == 1, 1 - x))


def _legendre(x, n):
    n = _integral_degree(n)
    on_edge = jnp.abs(x) == 1
    looped = _recurrence(
        jnp.where(on_edge, 0, n), x, lambda j, p, q: ((j + j + 1) * x * q - j * p) / (j + 1)
    )
    at_edge = jnp.where((x > 0) | (jnp.fmod(n, 2) == 0), 1, -1)
    return _first_of(looped, (n < 0, 0), (on_edge, at_edge), (n == 0, 1), (n == 1, x))


_POLYNOMIALS: dict[str, Callable[[Any, Any], Any]] = {
    "chebyshev_polynomial_t": _chebyshev("t", shifted=False, closed_above=6),
    "chebyshev_polynomial_u": _chebyshev("u", shifted=False, closed_above=8),
    "chebyshev_polynomial_v": _chebyshev("v", shifted=False, closed_above=8),
    "chebyshev_polynomial_w": _chebyshev("w", shifted=False, closed_above=8),
    "shifted_chebyshev_polynomial_t": _chebyshev("t", shifted=True, closed_above=6),
    "shifted_chebyshev_polynomial_u": _chebyshev("u", shifted=True, closed_above=6),
    "shifted_chebyshev_polynomial_v": _chebyshev("v", shifted=True, closed_above=6),
    "shifted_chebyshev_polynomial_w": _chebyshev("w", shifted=True, closed_above=4),
    "hermite_polynomial_h": _hermite(physicists=True),
    "hermite_polynomial_he": _hermite(physicists=False),
    "laguerre_polynomial_l": _laguerre,
    "legendre_polynomial_p": _legendre,
}

# --- registration ----------------------------------------------------------------------------

# IR op names -> function of the operands, cast to the compute dtype.
_POINTWISE: dict[tuple[str, ...], Callable[..., Any]] = {
    ("aten.special_airy_ai.default",): _airy_ai,
    ("aten.special_bessel_j0.default", "prims.bessel_j0.default"): _bessel_j0,
    ("aten.special_bessel_j1.default", "prims.bessel_j1.default"): _bessel_j1,
    ("aten.special_bessel_y0.default",): _bessel_y0,
    ("aten.special_bessel_y1.default",): _bessel_y1,
    (
        "aten.i0.default",
        "aten.special_modified_bessel_i0.default",
        "prims.bessel_i0.default",
    ): _bessel_i0,
    (
        "aten.special_i1.default",
        "aten.special_modified_bessel_i1.default",
        "prims.bessel_i1.default",
    ): _bessel_i1,
    ("aten.special_i0e.default", "prims.bessel_i0e.default"): lax.bessel_i0e,
    ("aten.special_i1e.default", "prims.bessel_i1e.default"): lax.bessel_i1e,
    ("aten.special_modified_bessel_k0.default",): _bessel_k(0, scaled=False),
    ("aten.special_modified_bessel_k1.default",): _bessel_k(1, scaled=False),
    ("aten.special_scaled_modified_bessel_k0.default",): _bessel_k(0, scaled=True),
    ("aten.special_scaled_modified_bessel_k1.default",): _bessel_k(1, scaled=True),
    (
        "aten.special_spherical_bessel_j0.default",
        "prims.spherical_bessel_j0.default",
    ): _spherical_bessel_j0,
    ("prims.erfcx.default",): _erfcx,
    ("prims.ndtri.default",): jsp.ndtri,
    ("prims.zeta.default",): _zeta,
    ("prims.igamma.default",): _incomplete_gamma(upper=False),
    ("prims.igammac.default",): _incomplete_gamma(upper=True),
    ("prims.nextafter.default",): _broadcasting(lax.nextafter),
    ("prims.gcd.default",): _gcd,
    # lax.div truncates integers (C's division) and divides floats exactly, as prims.div does.
    ("prims.div.default",): _broadcasting(lax.div),
    ("prims.shift_left.default",): shift_left,
    ("prims.shift_right_arithmetic.default",): shift_right,
}

for _ops, _fn in _POINTWISE.items():
    _register_pointwise(list(_ops), _fn)
for _op, _fn in _POLYNOMIALS.items():
    _register_pointwise(
        _names(f"special_{_op}", ("default", "x_scalar", "n_scalar")), _broadcasting(_fn)
    )


@lowering("aten.polygamma.default")
def _polygamma_lowering(ctx, n, x):
    (x,) = _operands(ctx, x)
    return _result(ctx, _polygamma(n, x))


@lowering("aten.angle.default")
def _angle(ctx, x):
    if jnp.iscomplexobj(x):
        return _result(ctx, jnp.angle(x))
    (x,) = _operands(ctx, x)
    return _result(ctx, _first_of(jnp.zeros_like(x), (jnp.isnan(x), x), (x < 0, math.pi)))


@lowering("prims.frexp.default")
def _frexp(ctx, x):
    (x,) = _operands(ctx, x)
    # Read off the bits: arithmetic scaling would meet XLA's flushing of subnormals to zero.
    info = jnp.finfo(x.dtype)
    width, mant, bias = info.bits, info.nmant, info.maxexp - 1
    uint = jnp.dtype(f"uint{width}")
    exponent_mask, fraction_mask = (1 << (width - 1 - mant)) - 1, (1 << mant) - 1
    bits = lax.bitcast_convert_type(x, uint)
    sign = bits & uint.type(1 << (width - 1))
    field = ((bits >> mant) & uint.type(exponent_mask)).astype(jnp.int32)
    fraction = bits & uint.type(fraction_mask)
    # Zeros, infinities and NaN come back unchanged, with exponent 0.
    keep = ((bits & ~sign) == 0) | (field == exponent_mask)
    # A subnormal's leading fraction bit becomes the implicit one.
    lead = width - 1 - lax.clz(fraction).astype(jnp.int32)
    subnormal = (field == 0) & (fraction != 0)
    normalized = (fraction << (mant - lead).astype(uint)) & uint.type(fraction_mask)
    fraction = jnp.where(subnormal, normalized, fraction)
    exponent = jnp.where(subnormal, lead - (bias + mant - 2), field - (bias - 1))
    mantissa = lax.bitcast_convert_type(sign | uint.type((bias - 1) << mant) | fraction, x.dtype)
    return (
        jnp.where(keep, x, mantissa).astype(ctx.dtypes[0]),
        jnp.where(keep, 0, exponent).astype(ctx.dtypes[1]),
    )

"""The default warm-up a zygote runs after its preloads, so that children start warm.

sympy imports much of itself lazily and fills caches on first use; a child forked from a cold
zygote pays for that in every execution. Exercising the common paths once in the zygote
(measured here: factor 32 -> 8 ms, solve 34 -> 10 ms, integrate 83 -> 45 ms) costs one
execution's worth of start-up and ~0.3 ms on a trivial execution (a larger image to fork).
Each part runs only when its module was preloaded.
"""

DEFAULT_WARMUP = """
import sys
if "sympy" in sys.modules:
    import sympy as sp
    x, y = sp.symbols("x y")
    sp.factor(x**4 + 2 * x**2 + 1)
    sp.expand((x + y) ** 3)
    sp.solve([x + y - 3, x - y - 1], [x, y])
    sp.solve(x**2 - 2, x)
    sp.simplify(sp.sin(x) ** 2 + sp.cos(x) ** 2)
    sp.integrate(x**2 * sp.exp(x), x)
    sp.diff(sp.log(x) * x, x)
    sp.limit(sp.sin(x) / x, x, 0)
    sp.series(sp.exp(x), x, 0, 4)
    sp.Matrix([[1, 2], [3, 4]]).inv()
    sp.nsimplify(0.75)
    sp.N(sp.pi, 20)
    sp.Rational(3, 4) + sp.sqrt(8)
    sp.factorint(360)
    sp.isprime(97)
    sp.binomial(10, 3)
    sp.latex(x**2 / y)
    sp.sympify("x + 1")
    sp.summation(x, (x, 1, 10))
    sp.gcd(12, 18)
if "math_verify" in sys.modules:  # preloaded for /v1/verify
    from math_verify import parse, verify
    verify(parse("$\\frac{1}{2}$"), parse("$0.5$"))
    import sandbox_service.math_answer
if "numpy" in sys.modules:
    import numpy as np
    np.linalg.solve(np.eye(3), np.ones(3))
    np.linalg.eig(np.eye(2))
    np.random.default_rng(0).random(3)
"""

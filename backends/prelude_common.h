/* dlcc portable dialect: helpers written once in the dialect itself, after the dialect prelude. */

/* max/min that propagate NaN, as ONNX Relu/Clip/Max/Min do (fmaxf/fmax return the other operand). */
DEVICE float dlcc_nmax(float a, float b) { return (a != a || a > b) ? a : b; }
DEVICE float dlcc_nmin(float a, float b) { return (a != a || a < b) ? a : b; }
#define F_NMAX dlcc_nmax
#define F_NMIN dlcc_nmin

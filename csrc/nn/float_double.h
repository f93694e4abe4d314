/* Compiles the body of a CPU reference file (PTL_BODY_FILE, which includes itself: the part its `#ifndef
 * PTL_BODY` leaves out) once for float and once for double, with T the element type, F(name) the name with
 * its _f32 / _f64 suffix and SIGMOID the sigmoid of that precision. */
#define PTL_BODY
#define T float
#define F(name) name##_f32
#define SIGMOID ptl_sigmoidf
#include PTL_BODY_FILE
#undef T
#undef F
#undef SIGMOID
#define T double
#define F(name) name##_f64
#define SIGMOID ptl_sigmoid
#include PTL_BODY_FILE
#undef T
#undef F
#undef SIGMOID

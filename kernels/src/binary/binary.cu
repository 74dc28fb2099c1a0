// f32's ops (binary.cuh).

BINARY_F32(add, x + y)
BINARY_F32(sub, x - y)
BINARY_F32(mul, x * y)
BINARY_F32(div, x / y)
BINARY_F32(maximum, fmaxf(x, y))
BINARY_F32(minimum, fminf(x, y))
BINARY_F32(gt, x > y ? 1.0f : 0.0f)
BINARY_F32(ge, x >= y ? 1.0f : 0.0f)
BINARY_F32(lt, x < y ? 1.0f : 0.0f)
BINARY_F32(le, x <= y ? 1.0f : 0.0f)
BINARY_F32(eq, x == y ? 1.0f : 0.0f)

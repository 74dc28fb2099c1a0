// f32's arithmetic (binary.cuh).

BINARY_F32(add, x + y)
BINARY_F32(sub, x - y)
BINARY_F32(mul, x * y)
BINARY_F32(div, x / y)
BINARY_F32(maximum, fmaxf(x, y))
BINARY_F32(minimum, fminf(x, y))

// i32's ops (binary.cuh).

// Integer arithmetic wraps and division by zero gives 0, as on the CPU.
BINARY_I32(add, (int)((u32)x + (u32)y))
BINARY_I32(sub, (int)((u32)x - (u32)y))
BINARY_I32(mul, (int)((u32)x * (u32)y))
BINARY_I32(div, y == 0 ? 0 : ((x == (int)0x80000000 && y == -1) ? x : x / y))
BINARY_I32(maximum, x > y ? x : y)
BINARY_I32(minimum, x < y ? x : y)
BINARY_I32(gt, x > y ? 1 : 0)
BINARY_I32(ge, x >= y ? 1 : 0)
BINARY_I32(lt, x < y ? 1 : 0)
BINARY_I32(le, x <= y ? 1 : 0)
BINARY_I32(eq, x == y ? 1 : 0)

// f32's comparisons, 1 or 0 (binary.cuh).

BINARY_F32(gt, x > y ? 1.0f : 0.0f)
BINARY_F32(ge, x >= y ? 1.0f : 0.0f)
BINARY_F32(lt, x < y ? 1.0f : 0.0f)
BINARY_F32(le, x <= y ? 1.0f : 0.0f)
BINARY_F32(eq, x == y ? 1.0f : 0.0f)

// bf16's and f16's ops, for activations kept in the low type (binary.cuh).

BINARY_16(add, x + y)
BINARY_16(sub, x - y)
BINARY_16(mul, x * y)

// where over f32 and i32 values, with f32, i32 or u8 masks (binary.cuh).

WHERE(f32, float, f32, float)
WHERE(i32, int, f32, float)
WHERE(u8, u8, f32, float)
WHERE(f32, float, i32, int)
WHERE(i32, int, i32, int)
WHERE(u8, u8, i32, int)

use cohort_alloc::{Bfc, Block, Config, SimMemory, TenantId};
use std::hint::black_box;
fn main() {
    let stitched = std::env::args().nth(1).as_deref() == Some("stitched");
    let bfc = if stitched {
        Bfc::new(SimMemory::stitched(1 << 40), Config::default()).unwrap()
    } else {
        Bfc::new(SimMemory::new(1 << 40), Config::default()).unwrap()
    };
    let blocks: Vec<Block> = (0..256)
        .map(|i| bfc.alloc(256 * (1 + i % 97), TenantId::DEFAULT).unwrap())
        .collect();
    for b in blocks {
        bfc.free(b);
    }
    let t = std::time::Instant::now();
    let n: u32 = std::env::var("N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000_000);
    for _ in 0..n {
        let block = bfc.alloc(black_box(4096), TenantId::DEFAULT).unwrap();
        bfc.free(black_box(block));
    }
    println!("{:.1} ns/pair", t.elapsed().as_nanos() as f64 / n as f64);
}

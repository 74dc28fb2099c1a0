//! Real memory through the BFC: host memory here, device memory on a GPU (ignored without one).

use cohort_alloc::{
    Bfc, Config, CudaMemory, Error, HostMemory, MemorySource, TenantId, TenantLimits,
};

const MIB: u64 = 1 << 20;

#[test]
fn host_memory_is_written_and_read_back_through_the_bfc() {
    let bfc = Bfc::new(HostMemory::with_capacity(256 * MIB), Config::default()).unwrap();
    let t = bfc
        .add_tenant("loader", TenantLimits::limit(64 * MIB))
        .unwrap();
    let blocks: Vec<_> = (1..=16)
        .map(|k| bfc.alloc(k * 10_000, t).unwrap())
        .collect();
    for (k, b) in blocks.iter().enumerate() {
        assert_eq!(b.ptr % 256, 0);
        // SAFETY: the block is `b.size` bytes of live host memory owned by this test.
        let s = unsafe { std::slice::from_raw_parts_mut(b.ptr as *mut u8, b.size as usize) };
        s.fill(k as u8);
    }
    for (k, b) in blocks.iter().enumerate() {
        // SAFETY: as above; nothing else wrote to it.
        let s = unsafe { std::slice::from_raw_parts(b.ptr as *const u8, b.size as usize) };
        assert!(s.iter().all(|&x| x == k as u8), "block {k} was overwritten");
    }
    for b in blocks {
        bfc.free(b);
    }
    bfc.check_invariants().unwrap();
    let reserved = bfc.counters().reserved;
    assert!(reserved > 0);
    assert_eq!(bfc.trim(), reserved);
    assert_eq!(
        bfc.with_source(|s| s.capacity() - s.device_free().min(s.capacity())),
        0
    );
}

#[test]
fn asking_for_a_gpu_without_one_is_a_clear_error() {
    if cohort_alloc::cuda_available() {
        return;
    }
    let e = CudaMemory::new(0).unwrap_err();
    assert!(
        matches!(
            e,
            Error::NotCompiledWithCuda { .. } | Error::NoCudaDevice { .. }
        ),
        "{e:?}"
    );
    let text = e.to_string();
    assert!(
        text.contains("cuda") && text.contains("COHORT_DEVICE=cpu"),
        "{text}"
    );
    let config = Config::builder()
        .device(cohort_alloc::DeviceSelector::Cuda(0))
        .build()
        .unwrap();
    assert!(cohort_alloc::device_allocator(&config).is_err());
    let auto = cohort_alloc::device_allocator(&Config::default()).unwrap();
    assert_eq!(auto.stats().device, "cpu");
}

#[cfg(feature = "cuda")]
mod gpu {
    /// The driver's free memory is device-wide: the tests take turns so no other test's memory moves it.
    static DEVICE: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn exclusive() -> std::sync::MutexGuard<'static, ()> {
        DEVICE
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    use super::MIB;
    use cohort_alloc::{Backend, Bfc, Config, CudaMemory, CudaVmm, MemorySource, TenantId};
    use cudarc::driver::sys;

    fn write(ptr: u64, data: &[u32]) {
        // SAFETY: `ptr` is device memory of at least `data.len() * 4` bytes in the current context.
        let r = unsafe { sys::cuMemcpyHtoD_v2(ptr, data.as_ptr().cast(), data.len() * 4) };
        assert_eq!(r, sys::CUresult::CUDA_SUCCESS);
    }

    fn read(ptr: u64, n: usize) -> Vec<u32> {
        let mut out = vec![0u32; n];
        // SAFETY: `ptr` is device memory of at least `n * 4` bytes in the current context.
        let r = unsafe { sys::cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), ptr, n * 4) };
        assert_eq!(r, sys::CUresult::CUDA_SUCCESS);
        out
    }

    fn pattern(seed: u32, n: usize) -> Vec<u32> {
        (0..n as u32)
            .map(|i| i.wrapping_mul(2_654_435_761) ^ seed)
            .collect()
    }

    fn round_trip<S: MemorySource>(bfc: &Bfc<S>) {
        let sizes = [1000usize, 1 << 20, 3 << 20, 256, 17 << 20, 5000];
        let blocks: Vec<_> = sizes
            .iter()
            .map(|&s| bfc.alloc(s, TenantId::DEFAULT).unwrap())
            .collect();
        for (k, (b, &s)) in blocks.iter().zip(&sizes).enumerate() {
            write(b.ptr, &pattern(k as u32, s / 4));
        }
        for (k, (b, &s)) in blocks.iter().zip(&sizes).enumerate() {
            assert_eq!(read(b.ptr, s / 4), pattern(k as u32, s / 4), "block {k}");
        }
        for b in blocks {
            bfc.free(b);
        }
        bfc.check_invariants().unwrap();
    }

    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn cuda_segments_written_and_read_back() {
        let _turn = exclusive();
        let bfc = Bfc::new(CudaMemory::new(0).unwrap(), Config::default()).unwrap();
        round_trip(&bfc);
    }

    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn cuda_stitched_pages_survive_moves() {
        let _turn = exclusive();
        let config = Config::builder().idle_page_slack(0).build().unwrap();
        let bfc = Bfc::new(CudaVmm::new(0).unwrap(), config).unwrap();
        round_trip(&bfc);
        // Page 0 idle, b live; d past b takes page 0's physical page by a move: b's data must stay intact.
        let a = bfc.alloc((2 * MIB) as usize, TenantId::DEFAULT).unwrap();
        let b = bfc.alloc((2 * MIB) as usize, TenantId::DEFAULT).unwrap();
        write(b.ptr, &pattern(7, (2 * MIB / 4) as usize));
        bfc.free(a);
        let before = bfc.counters().page_moves;
        let d = bfc.alloc((40 * MIB) as usize, TenantId::DEFAULT).unwrap();
        write(d.ptr, &pattern(9, (40 * MIB / 4) as usize));
        assert!(bfc.counters().page_moves > before, "{:?}", bfc.counters());
        assert_eq!(
            read(b.ptr, (2 * MIB / 4) as usize),
            pattern(7, (2 * MIB / 4) as usize)
        );
        assert_eq!(
            read(d.ptr, (40 * MIB / 4) as usize),
            pattern(9, (40 * MIB / 4) as usize)
        );
        bfc.free(b);
        bfc.free(d);
        bfc.check_invariants().unwrap();
    }

    /// With the compute stream known, a page freed while queued work still uses it moves without waiting: the
    /// stream is still busy after the move, and work queued after it sees the new block's data.
    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn cuda_stitched_moves_pages_without_waiting_for_the_stream() {
        let _turn = exclusive();
        let stream = cohort_alloc::cuda_context(0).unwrap().new_stream().unwrap();
        let config = Config::builder()
            .idle_page_slack(0)
            .large_block(u64::MAX)
            .build()
            .unwrap();
        let bfc = Bfc::new(CudaVmm::with_stream(stream.clone()).unwrap(), config).unwrap();
        let a = bfc.alloc((64 * MIB) as usize, TenantId::DEFAULT).unwrap();
        let b = bfc.alloc((2 * MIB) as usize, TenantId::DEFAULT).unwrap();
        write(b.ptr, &pattern(5, (2 * MIB / 4) as usize));
        let words = (64 * MIB / 4) as usize;
        // Tens of milliseconds of queued work on a, which is freed (in stream order) at once.
        for k in 0..2000u32 {
            // SAFETY: `a` is 64 MiB of device memory; the stream belongs to the current context.
            let r = unsafe { sys::cuMemsetD32Async(a.ptr, k, words, stream.cu_stream()) };
            assert_eq!(r, sys::CUresult::CUDA_SUCCESS);
        }
        bfc.free(a);
        let before = bfc.counters();
        // Too large for a's hole, so past b: 32 of its 33 pages are a's, moved while the memsets still run.
        let d = bfc.alloc((66 * MIB) as usize, TenantId::DEFAULT).unwrap();
        // SAFETY: the stream is live.
        let busy = unsafe { sys::cuStreamQuery(stream.cu_stream()) };
        let c = bfc.counters();
        assert_eq!(c.page_moves - before.page_moves, 32, "{c:?}");
        assert_eq!((c.stream_waits, c.synchronising_moves), (0, 0), "{c:?}");
        assert_eq!(
            busy,
            sys::CUresult::CUDA_ERROR_NOT_READY,
            "the move waited for the stream"
        );
        assert_eq!(bfc.stats().pages_retired, 32);
        let d_words = (66 * MIB / 4) as usize;
        // SAFETY: `d` is 66 MiB of device memory; queued after the memsets on a.
        let r = unsafe { sys::cuMemsetD32Async(d.ptr, 0xD00D, d_words, stream.cu_stream()) };
        assert_eq!(r, sys::CUresult::CUDA_SUCCESS);
        stream.synchronize().unwrap();
        assert!(read(d.ptr, d_words).iter().all(|&x| x == 0xD00D));
        assert_eq!(
            read(b.ptr, (2 * MIB / 4) as usize),
            pattern(5, (2 * MIB / 4) as usize)
        );
        // The stream has passed a's last use: the next page fault (in a's hole) unmaps the old pages, no wait.
        let e = bfc.alloc((4 * MIB) as usize, TenantId::DEFAULT).unwrap();
        let s = bfc.stats();
        assert_eq!((s.pages_retired, s.counters.stream_waits), (0, 0), "{s}");
        for x in [b, d, e] {
            bfc.free(x);
        }
        bfc.check_invariants().unwrap();
        stream.synchronize().unwrap();
        assert!(bfc.trim() > 0);
        assert_eq!(bfc.counters().reserved, 0);
    }

    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn cuda_async_backend_written_and_read_back() {
        let _turn = exclusive();
        let config = Config::builder()
            .backend(Backend::Async)
            .release_threshold(64 * MIB)
            .build()
            .unwrap();
        let bfc = Bfc::new(
            cohort_alloc::CudaAsyncPool::new(0, Some(64 * MIB)).unwrap(),
            config,
        )
        .unwrap();
        let b = bfc.alloc(1 << 20, TenantId::DEFAULT).unwrap();
        // SAFETY: synchronizing the current context (the allocator bound it) so the stream-ordered allocation is
        // complete before a synchronous copy.
        let r = unsafe { sys::cuCtxSynchronize() };
        assert_eq!(r, sys::CUresult::CUDA_SUCCESS);
        write(b.ptr, &pattern(3, 1 << 18));
        assert_eq!(read(b.ptr, 1 << 18), pattern(3, 1 << 18));
        bfc.free(b);
        assert_eq!(bfc.counters().source_releases, 1);
    }

    /// The driver's free memory drops and rises by what the stats say the allocator reserved and trimmed.
    fn driver_free_follows_stats<S: MemorySource>(bfc: &Bfc<S>) {
        let slack = 8 * MIB;
        let free0 = bfc.with_source(|s| s.device_free());
        let blocks: Vec<_> = (0..8)
            .map(|_| bfc.alloc((64 * MIB) as usize, TenantId::DEFAULT).unwrap())
            .collect();
        let reserved = bfc.counters().reserved;
        assert!(reserved >= 512 * MIB);
        let free1 = bfc.with_source(|s| s.device_free());
        let drop = free0 - free1;
        assert!(
            drop.abs_diff(reserved) <= slack,
            "driver free fell {drop}, stats reserved {reserved}"
        );
        for b in blocks {
            bfc.free(b);
        }
        let free2 = bfc.with_source(|s| s.device_free());
        assert!(
            free2.abs_diff(free1) <= slack,
            "a cached free gives nothing back"
        );
        let trimmed = bfc.trim();
        assert_eq!(trimmed, reserved);
        let free3 = bfc.with_source(|s| s.device_free());
        assert!(
            free3.abs_diff(free0) <= slack,
            "after trim: {free3} vs {free0}"
        );
        let report = bfc.stats();
        assert_eq!(report.counters.reserved, 0);
        assert!(report.device_free.abs_diff(free3) <= slack);
    }

    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn cuda_segments_driver_free_memory_moves_as_stats_say() {
        let _turn = exclusive();
        driver_free_follows_stats(
            &Bfc::new(CudaMemory::new(0).unwrap(), Config::default()).unwrap(),
        );
    }

    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn cuda_stitched_driver_free_memory_moves_as_stats_say() {
        let _turn = exclusive();
        driver_free_follows_stats(&Bfc::new(CudaVmm::new(0).unwrap(), Config::default()).unwrap());
    }

    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn device_allocator_picks_the_stitched_source_on_a_gpu() {
        let _turn = exclusive();
        let bfc = cohort_alloc::device_allocator(&Config::default()).unwrap();
        let report = bfc.stats();
        assert_eq!(report.layout, "stitched", "{report}");
        assert!(report.device.starts_with("cuda:0"));
        let b = bfc.alloc(1000, TenantId::DEFAULT).unwrap();
        write(b.ptr, &[1, 2, 3]);
        assert_eq!(read(b.ptr, 3), vec![1, 2, 3]);
        bfc.free(b);
    }
}

#[test]
fn default_tenant_exists() {
    let bfc = Bfc::new(HostMemory::with_capacity(16 * MIB), Config::default()).unwrap();
    assert_eq!(bfc.tenant("default"), Some(TenantId::DEFAULT));
}

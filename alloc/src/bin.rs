//! Chunks and bins: the free-chunk index of the BFC.
//!
//! Chunks live in one slab (`Vec<Chunk>`, slots reused through a vacancy list), linked to their address neighbours
//! by index. Free chunks sit in size-class bins, bin `b` holding sizes in `(256·2^(b-1), 256·2^b]`; each bin is an
//! intrusive treap ordered by (size, address), threaded by in-order neighbour links, and a bitmap tells which bins
//! are non-empty. Best fit is a lower-bound search in the request's bin, else the smallest chunk of the next
//! non-empty bin: O(log n), and no heap allocation once the slab has grown to the working set. The threads make a
//! free chunk's resize in place an O(1) check: it keeps its treap place while it stays between its neighbours.

/// No chunk.
pub(crate) const NIL: u32 = u32::MAX;
/// Allocation granularity and alignment of every chunk.
pub(crate) const GRANULE: u64 = 256;
/// Number of size classes (the last one takes everything above 256 B · 2^46).
pub(crate) const NBINS: usize = 48;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum State {
    Vacant,
    Free,
    Used,
    /// Freed and accounted so, but neither coalesced nor binned yet (`bfc/park.rs`).
    Parked,
}

/// A free chunk's links in its bin: treap children and in-order neighbours.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Links {
    pub left: u32,
    pub right: u32,
    /// The next smaller and next larger chunk of the same bin, in (size, address) order.
    pub lo: u32,
    pub hi: u32,
}

impl Links {
    /// In no bin.
    pub const NONE: Links = Links {
        left: NIL,
        right: NIL,
        lo: NIL,
        hi: NIL,
    };
}

/// A piece of a region: free or handed out.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Chunk {
    pub ptr: u64,
    pub size: u64,
    /// Address neighbours in the same region (a vacant slot keeps the next vacant slot in `next`).
    pub prev: u32,
    pub next: u32,
    /// Bin links while free.
    pub tree: Links,
    pub region: u32,
    pub tenant: u16,
    /// Which set of bins holds it while free (the stitched layout keeps large blocks apart).
    pub arena: u8,
    pub state: State,
}

/// The chunk slab.
#[derive(Debug, Default)]
pub(crate) struct Chunks {
    pub v: Vec<Chunk>,
    vacant: u32,
    pub vacant_count: u32,
}

impl Chunks {
    pub fn new() -> Self {
        Self {
            v: Vec::new(),
            vacant: NIL,
            vacant_count: 0,
        }
    }

    #[inline]
    pub fn add(&mut self, c: Chunk) -> u32 {
        if self.vacant != NIL {
            let i = self.vacant;
            self.vacant = self.v[i as usize].next;
            self.vacant_count -= 1;
            self.v[i as usize] = c;
            i
        } else {
            self.v.push(c);
            (self.v.len() - 1) as u32
        }
    }

    #[inline]
    pub fn vacate(&mut self, i: u32) {
        let c = &mut self.v[i as usize];
        c.state = State::Vacant;
        c.next = self.vacant;
        self.vacant = i;
        self.vacant_count += 1;
    }
}

/// Size class of a chunk size (a multiple of [`GRANULE`]): bin `b` holds `(256·2^(b-1), 256·2^b]`. Closed above, so a
/// fresh region of a power-of-two size stays in its bin when a block is cut from it, and keeps its treap place.
#[inline]
pub(crate) fn bin_of(size: u64) -> usize {
    let q = (size >> GRANULE.trailing_zeros()).max(1);
    ((64 - (q - 1).leading_zeros()) as usize).min(NBINS - 1)
}

#[inline]
fn prio(i: u32) -> u64 {
    // splitmix64 of the slot index: random-looking, fixed per slot, no state.
    let mut z = u64::from(i).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[inline]
fn key(ch: &[Chunk], i: u32) -> (u64, u64) {
    let c = &ch[i as usize];
    (c.size, c.ptr)
}

/// Inserts `i` under `root`; `lo` and `hi` end as its in-order neighbours: the last nodes the search passed on
/// its right and on its left (rotations keep the order).
fn insert(ch: &mut [Chunk], root: u32, i: u32, lo: &mut u32, hi: &mut u32) -> u32 {
    if root == NIL {
        ch[i as usize].tree.left = NIL;
        ch[i as usize].tree.right = NIL;
        return i;
    }
    let r = root as usize;
    if key(ch, i) < key(ch, root) {
        *hi = root;
        let l = insert(ch, ch[r].tree.left, i, lo, hi);
        ch[r].tree.left = l;
        if prio(l) > prio(root) {
            ch[r].tree.left = ch[l as usize].tree.right;
            ch[l as usize].tree.right = root;
            return l;
        }
    } else {
        *lo = root;
        let x = insert(ch, ch[r].tree.right, i, lo, hi);
        ch[r].tree.right = x;
        if prio(x) > prio(root) {
            ch[r].tree.right = ch[x as usize].tree.left;
            ch[x as usize].tree.left = root;
            return x;
        }
    }
    root
}

fn merge(ch: &mut [Chunk], a: u32, b: u32) -> u32 {
    if a == NIL {
        return b;
    }
    if b == NIL {
        return a;
    }
    if prio(a) > prio(b) {
        let m = merge(ch, ch[a as usize].tree.right, b);
        ch[a as usize].tree.right = m;
        a
    } else {
        let m = merge(ch, a, ch[b as usize].tree.left);
        ch[b as usize].tree.left = m;
        b
    }
}

fn remove(ch: &mut [Chunk], root: u32, i: u32) -> u32 {
    if root == NIL {
        return NIL;
    }
    if root == i {
        return merge(ch, ch[i as usize].tree.left, ch[i as usize].tree.right);
    }
    let r = root as usize;
    if key(ch, i) < key(ch, root) {
        let l = remove(ch, ch[r].tree.left, i);
        ch[r].tree.left = l;
    } else {
        let x = remove(ch, ch[r].tree.right, i);
        ch[r].tree.right = x;
    }
    root
}

/// The bins.
#[derive(Debug)]
pub(crate) struct Bins {
    roots: [u32; NBINS],
    bitmap: u64,
    /// Free chunks and their bytes, kept for stats.
    pub count: u64,
    pub bytes: u64,
}

impl Bins {
    pub fn new() -> Self {
        Self {
            roots: [NIL; NBINS],
            bitmap: 0,
            count: 0,
            bytes: 0,
        }
    }

    #[inline]
    pub fn insert(&mut self, ch: &mut [Chunk], i: u32) {
        let b = bin_of(ch[i as usize].size);
        let (mut lo, mut hi) = (NIL, NIL);
        self.roots[b] = insert(ch, self.roots[b], i, &mut lo, &mut hi);
        ch[i as usize].tree.lo = lo;
        ch[i as usize].tree.hi = hi;
        if lo != NIL {
            ch[lo as usize].tree.hi = i;
        }
        if hi != NIL {
            ch[hi as usize].tree.lo = i;
        }
        self.bitmap |= 1 << b;
        self.count += 1;
        self.bytes += ch[i as usize].size;
    }

    #[inline]
    pub fn remove(&mut self, ch: &mut [Chunk], i: u32) {
        let b = bin_of(ch[i as usize].size);
        self.roots[b] = remove(ch, self.roots[b], i);
        if self.roots[b] == NIL {
            self.bitmap &= !(1 << b);
        }
        let Links { lo, hi, .. } = ch[i as usize].tree;
        if lo != NIL {
            ch[lo as usize].tree.hi = hi;
        }
        if hi != NIL {
            ch[hi as usize].tree.lo = lo;
        }
        ch[i as usize].tree = Links::NONE;
        self.count -= 1;
        self.bytes -= ch[i as usize].size;
    }

    /// Moves binned chunk `i` to `[ptr, ptr + size)`: in place when it stays in its bin between the same
    /// neighbours (the common case of a block cut from or given back to a large free chunk), else out and in again.
    #[inline]
    pub fn resize(&mut self, ch: &mut [Chunk], i: u32, ptr: u64, size: u64) {
        let c = ch[i as usize];
        let new = (size, ptr);
        let in_place = bin_of(size) == bin_of(c.size)
            && (c.tree.lo == NIL || key(ch, c.tree.lo) < new)
            && (c.tree.hi == NIL || new < key(ch, c.tree.hi));
        if !in_place {
            self.remove(ch, i);
            ch[i as usize].ptr = ptr;
            ch[i as usize].size = size;
            self.insert(ch, i);
            return;
        }
        ch[i as usize].ptr = ptr;
        ch[i as usize].size = size;
        self.bytes = self.bytes - c.size + size;
    }

    /// The smallest free chunk of at least `size` bytes (lowest address among equals).
    #[inline]
    pub fn best_fit(&self, ch: &[Chunk], size: u64) -> Option<u32> {
        let b = bin_of(size);
        let mut n = self.roots[b];
        let mut best = NIL;
        while n != NIL {
            let c = &ch[n as usize];
            if c.size >= size {
                best = n;
                n = c.tree.left;
            } else {
                n = c.tree.right;
            }
        }
        if best != NIL {
            return Some(best);
        }
        self.first_above(ch, b)
    }

    /// The free chunk after `i` in (size, address) order, across bins.
    pub fn successor(&self, ch: &[Chunk], i: u32) -> Option<u32> {
        match ch[i as usize].tree.hi {
            NIL => self.first_above(ch, bin_of(ch[i as usize].size)),
            hi => Some(hi),
        }
    }

    /// The smallest free chunk of the first non-empty bin above bin `b`.
    fn first_above(&self, ch: &[Chunk], b: usize) -> Option<u32> {
        let above = if b + 1 >= NBINS {
            0
        } else {
            self.bitmap & !((1u64 << (b + 1)) - 1)
        };
        if above == 0 {
            return None;
        }
        let mut n = self.roots[above.trailing_zeros() as usize];
        while ch[n as usize].tree.left != NIL {
            n = ch[n as usize].tree.left;
        }
        Some(n)
    }

    /// Size of the largest free chunk (0 when none).
    pub fn largest(&self, ch: &[Chunk]) -> u64 {
        self.largest_chunk(ch).map_or(0, |n| ch[n as usize].size)
    }

    /// The largest free chunk (the highest of those of its size).
    pub fn largest_chunk(&self, ch: &[Chunk]) -> Option<u32> {
        if self.bitmap == 0 {
            return None;
        }
        let mut n = self.roots[63 - self.bitmap.leading_zeros() as usize];
        while ch[n as usize].tree.right != NIL {
            n = ch[n as usize].tree.right;
        }
        Some(n)
    }

    /// Visits every free chunk of every bin in (size, address) order (for invariant checks).
    pub fn for_each(&self, ch: &[Chunk], mut f: impl FnMut(usize, u32)) {
        fn walk(ch: &[Chunk], n: u32, b: usize, f: &mut impl FnMut(usize, u32)) {
            if n == NIL {
                return;
            }
            walk(ch, ch[n as usize].tree.left, b, f);
            f(b, n);
            walk(ch, ch[n as usize].tree.right, b, f);
        }
        for (b, &r) in self.roots.iter().enumerate() {
            walk(ch, r, b, &mut f);
        }
    }

    /// Checks that every bin's threads link its chunks in the treap's in-order sequence.
    pub fn check_threads(&self, ch: &[Chunk]) -> Result<(), String> {
        let mut order: Vec<Vec<u32>> = vec![Vec::new(); NBINS];
        self.for_each(ch, |b, i| order[b].push(i));
        for (b, seq) in order.iter().enumerate() {
            for (k, &i) in seq.iter().enumerate() {
                let lo = if k == 0 { NIL } else { seq[k - 1] };
                let hi = seq.get(k + 1).copied().unwrap_or(NIL);
                let t = ch[i as usize].tree;
                if t.lo != lo || t.hi != hi {
                    return Err(format!(
                        "bin {b}: chunk {i} threads to {}/{}, in order it sits between {lo}/{hi}",
                        t.lo, t.hi
                    ));
                }
            }
        }
        Ok(())
    }
}

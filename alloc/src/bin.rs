//! Chunks and bins: the free-chunk index of the BFC.
//!
//! Chunks live in one slab (`Vec<Chunk>`, slots reused through a vacancy list), linked to their address neighbours
//! by index. Free chunks sit in size-class bins, bin `b` holding sizes in `[256·2^b, 256·2^(b+1))`; each bin is an
//! intrusive treap ordered by (size, address), and a bitmap tells which bins are non-empty. Best fit is a
//! lower-bound search in the request's bin, else the smallest chunk of the next non-empty bin: O(log n), and no
//! heap allocation once the slab has grown to the working set.

/// No chunk.
pub(crate) const NIL: u32 = u32::MAX;
/// Allocation granularity and alignment of every chunk.
pub(crate) const GRANULE: u64 = 256;
/// Number of size classes (the last one takes everything above 256 B · 2^47).
pub(crate) const NBINS: usize = 48;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum State {
    Vacant,
    Free,
    Used,
}

/// A piece of a region: free or handed out.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Chunk {
    pub ptr: u64,
    pub size: u64,
    /// Address neighbours in the same region (a vacant slot keeps the next vacant slot in `next`).
    pub prev: u32,
    pub next: u32,
    /// Treap children while free.
    pub left: u32,
    pub right: u32,
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

    pub fn vacate(&mut self, i: u32) {
        let c = &mut self.v[i as usize];
        c.state = State::Vacant;
        c.next = self.vacant;
        self.vacant = i;
        self.vacant_count += 1;
    }
}

/// Size class of a chunk size (at least [`GRANULE`]).
pub(crate) fn bin_of(size: u64) -> usize {
    let q = size / GRANULE;
    ((63 - q.max(1).leading_zeros()) as usize).min(NBINS - 1)
}

fn prio(i: u32) -> u64 {
    // splitmix64 of the slot index: random-looking, fixed per slot, no state.
    let mut z = u64::from(i).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn key(ch: &[Chunk], i: u32) -> (u64, u64) {
    let c = &ch[i as usize];
    (c.size, c.ptr)
}

fn insert(ch: &mut [Chunk], root: u32, i: u32) -> u32 {
    if root == NIL {
        ch[i as usize].left = NIL;
        ch[i as usize].right = NIL;
        return i;
    }
    let r = root as usize;
    if key(ch, i) < key(ch, root) {
        let l = insert(ch, ch[r].left, i);
        ch[r].left = l;
        if prio(l) > prio(root) {
            ch[r].left = ch[l as usize].right;
            ch[l as usize].right = root;
            return l;
        }
    } else {
        let x = insert(ch, ch[r].right, i);
        ch[r].right = x;
        if prio(x) > prio(root) {
            ch[r].right = ch[x as usize].left;
            ch[x as usize].left = root;
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
        let m = merge(ch, ch[a as usize].right, b);
        ch[a as usize].right = m;
        a
    } else {
        let m = merge(ch, a, ch[b as usize].left);
        ch[b as usize].left = m;
        b
    }
}

fn remove(ch: &mut [Chunk], root: u32, i: u32) -> u32 {
    if root == NIL {
        return NIL;
    }
    if root == i {
        return merge(ch, ch[i as usize].left, ch[i as usize].right);
    }
    let r = root as usize;
    if key(ch, i) < key(ch, root) {
        let l = remove(ch, ch[r].left, i);
        ch[r].left = l;
    } else {
        let x = remove(ch, ch[r].right, i);
        ch[r].right = x;
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

    pub fn insert(&mut self, ch: &mut [Chunk], i: u32) {
        let b = bin_of(ch[i as usize].size);
        self.roots[b] = insert(ch, self.roots[b], i);
        self.bitmap |= 1 << b;
        self.count += 1;
        self.bytes += ch[i as usize].size;
    }

    pub fn remove(&mut self, ch: &mut [Chunk], i: u32) {
        let b = bin_of(ch[i as usize].size);
        self.roots[b] = remove(ch, self.roots[b], i);
        if self.roots[b] == NIL {
            self.bitmap &= !(1 << b);
        }
        self.count -= 1;
        self.bytes -= ch[i as usize].size;
    }

    /// The smallest free chunk of at least `size` bytes (lowest address among equals).
    pub fn best_fit(&self, ch: &[Chunk], size: u64) -> Option<u32> {
        let b = bin_of(size);
        let mut n = self.roots[b];
        let mut best = NIL;
        while n != NIL {
            let c = &ch[n as usize];
            if c.size >= size {
                best = n;
                n = c.left;
            } else {
                n = c.right;
            }
        }
        if best != NIL {
            return Some(best);
        }
        self.first_above(ch, b)
    }

    /// The free chunk after `i` in (size, address) order, across bins.
    pub fn successor(&self, ch: &[Chunk], i: u32) -> Option<u32> {
        let k = key(ch, i);
        let b = bin_of(k.0);
        let mut n = self.roots[b];
        let mut best = NIL;
        while n != NIL {
            if key(ch, n) > k {
                best = n;
                n = ch[n as usize].left;
            } else {
                n = ch[n as usize].right;
            }
        }
        if best != NIL {
            return Some(best);
        }
        self.first_above(ch, b)
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
        while ch[n as usize].left != NIL {
            n = ch[n as usize].left;
        }
        Some(n)
    }

    /// Size of the largest free chunk (0 when none).
    pub fn largest(&self, ch: &[Chunk]) -> u64 {
        if self.bitmap == 0 {
            return 0;
        }
        let mut n = self.roots[63 - self.bitmap.leading_zeros() as usize];
        while ch[n as usize].right != NIL {
            n = ch[n as usize].right;
        }
        ch[n as usize].size
    }

    /// Visits every free chunk of every bin (for invariant checks).
    pub fn for_each(&self, ch: &[Chunk], mut f: impl FnMut(usize, u32)) {
        fn walk(ch: &[Chunk], n: u32, b: usize, f: &mut impl FnMut(usize, u32)) {
            if n == NIL {
                return;
            }
            walk(ch, ch[n as usize].left, b, f);
            f(b, n);
            walk(ch, ch[n as usize].right, b, f);
        }
        for (b, &r) in self.roots.iter().enumerate() {
            walk(ch, r, b, &mut f);
        }
    }
}

//! A set of page indices for the page table's idle and retired pages.

/// A set of page indices with O(1) insert and remove and a highest-member query in three word scans: one bit per
/// page, one per non-empty word, one per non-empty word of those. Allocated once.
#[derive(Debug)]
pub(super) struct PageSet {
    pub(super) l0: Vec<u64>,
    l1: Vec<u64>,
    l2: Vec<u64>,
}

impl PageSet {
    pub(super) fn new(n: usize) -> Self {
        let w0 = n.div_ceil(64).max(1);
        let w1 = w0.div_ceil(64).max(1);
        let w2 = w1.div_ceil(64).max(1);
        Self {
            l0: vec![0; w0],
            l1: vec![0; w1],
            l2: vec![0; w2],
        }
    }

    #[inline]
    pub(super) fn insert(&mut self, p: u32) {
        let p = p as usize;
        self.l0[p >> 6] |= 1 << (p & 63);
        self.l1[p >> 12] |= 1 << ((p >> 6) & 63);
        self.l2[p >> 18] |= 1 << ((p >> 12) & 63);
    }

    #[inline]
    pub(super) fn remove(&mut self, p: u32) {
        let p = p as usize;
        self.l0[p >> 6] &= !(1 << (p & 63));
        if self.l0[p >> 6] == 0 {
            self.l1[p >> 12] &= !(1 << ((p >> 6) & 63));
            if self.l1[p >> 12] == 0 {
                self.l2[p >> 18] &= !(1 << ((p >> 12) & 63));
            }
        }
    }

    pub(super) fn highest(&self) -> Option<u32> {
        let i2 = self.l2.iter().rposition(|&w| w != 0)?;
        let i1 = i2 * 64 + 63 - self.l2[i2].leading_zeros() as usize;
        let i0 = i1 * 64 + 63 - self.l1[i1].leading_zeros() as usize;
        Some((i0 * 64 + 63 - self.l0[i0].leading_zeros() as usize) as u32)
    }

    /// The highest member at or below `p`: the rest of `p`'s word, then earlier words through the summary level.
    pub(super) fn highest_at_most(&self, p: u32) -> Option<u32> {
        let p = p as usize;
        let i0 = p >> 6;
        let w = self.l0[i0] & (u64::MAX >> (63 - (p & 63)));
        if w != 0 {
            return Some((i0 * 64 + 63 - w.leading_zeros() as usize) as u32);
        }
        // Non-empty words below `i0`, the highest first.
        let mut i1 = i0 >> 6;
        let mut mask = (1u64 << (i0 & 63)) - 1;
        loop {
            let w1 = self.l1[i1] & mask;
            if w1 != 0 {
                let j = i1 * 64 + 63 - w1.leading_zeros() as usize;
                return Some((j * 64 + 63 - self.l0[j].leading_zeros() as usize) as u32);
            }
            if i1 == 0 {
                return None;
            }
            i1 -= 1;
            mask = u64::MAX;
        }
    }

    /// The first non-empty word of members at or after word `from`, through the summary level.
    pub(super) fn next_word(&self, from: usize) -> Option<usize> {
        let mut i1 = from >> 6;
        let mut mask = u64::MAX << (from & 63);
        while i1 < self.l1.len() {
            let w = self.l1[i1] & mask;
            if w != 0 {
                return Some(i1 * 64 + w.trailing_zeros() as usize);
            }
            i1 += 1;
            mask = u64::MAX;
        }
        None
    }

    /// Calls `f` on every member, ascending; `f` may not change the set, but may read a copy of each word first.
    pub(super) fn for_each(&self, mut f: impl FnMut(u32)) {
        let mut i = 0;
        while let Some(i0) = self.next_word(i) {
            let mut w = self.l0[i0];
            while w != 0 {
                f((i0 * 64 + w.trailing_zeros() as usize) as u32);
                w &= w - 1;
            }
            i = i0 + 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::PageSet;

    #[test]
    fn idle_set_keeps_the_highest_member() {
        let mut s = PageSet::new(300_000);
        assert_eq!(s.highest(), None);
        for p in [5, 70_000, 4095, 4096, 262_143, 262_144, 299_999] {
            s.insert(p);
        }
        for expect in [299_999, 262_144, 262_143, 70_000, 4096, 4095, 5] {
            assert_eq!(s.highest(), Some(expect));
            s.remove(expect);
        }
        assert_eq!(s.highest(), None);
        for p in [7, 9, 70_000, 299_999] {
            s.insert(p);
        }
        let mut all = Vec::new();
        s.for_each(|p| all.push(p));
        assert_eq!(all, vec![7, 9, 70_000, 299_999]);
    }

    #[test]
    fn highest_at_most_finds_the_member_at_or_below() {
        let mut s = PageSet::new(300_000);
        assert_eq!(s.highest_at_most(299_999), None);
        for p in [0, 63, 64, 4095, 4096, 262_144, 299_999] {
            s.insert(p);
        }
        let cases = [
            (299_999, Some(299_999)),
            (299_998, Some(262_144)),
            (262_143, Some(4096)),
            (4096, Some(4096)),
            (4095, Some(4095)),
            (4094, Some(64)),
            (64, Some(64)),
            (63, Some(63)),
            (62, Some(0)),
            (0, Some(0)),
        ];
        for (p, expect) in cases {
            assert_eq!(s.highest_at_most(p), expect, "at most {p}");
        }
        s.remove(0);
        assert_eq!(s.highest_at_most(62), None);
    }
}

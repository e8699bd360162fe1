//! A fixed-size set of small integers (node or rule indexes), 64 to a word.

#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub(crate) struct BitSet {
    words: Vec<u64>,
}

impl BitSet {
    pub fn new(len: usize) -> Self {
        Self {
            words: vec![0; len.div_ceil(64)],
        }
    }

    pub fn full(len: usize) -> Self {
        let mut s = Self::new(len);
        for i in 0..len {
            s.insert(i);
        }
        s
    }

    pub fn insert(&mut self, i: usize) {
        if let Some(w) = self.words.get_mut(i / 64) {
            *w |= 1 << (i % 64);
        }
    }

    pub fn contains(&self, i: usize) -> bool {
        self.words
            .get(i / 64)
            .is_some_and(|w| w & (1 << (i % 64)) != 0)
    }

    pub fn union_with(&mut self, o: &BitSet) {
        for (a, b) in self.words.iter_mut().zip(&o.words) {
            *a |= b;
        }
    }

    pub fn subtract(&mut self, o: &BitSet) {
        for (a, b) in self.words.iter_mut().zip(&o.words) {
            *a &= !b;
        }
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.words.iter().all(|&w| w == 0)
    }

    /// Whether `self` and `o` share an element.
    pub fn meets(&self, o: &BitSet) -> bool {
        self.words.iter().zip(&o.words).any(|(a, b)| a & b != 0)
    }

    /// The elements of `self` that are also in `o`, ascending.
    pub fn common<'a>(&'a self, o: &'a BitSet) -> impl Iterator<Item = usize> + 'a {
        self.words
            .iter()
            .zip(&o.words)
            .enumerate()
            .flat_map(|(wi, (a, b))| ones(wi, a & b))
    }

    /// The elements, ascending.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.words
            .iter()
            .enumerate()
            .flat_map(|(wi, &w)| ones(wi, w))
    }
}

fn ones(wi: usize, mut w: u64) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        if w == 0 {
            return None;
        }
        let bit = w.trailing_zeros() as usize;
        w &= w - 1;
        Some(wi * 64 + bit)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_operations() {
        let mut a = BitSet::new(130);
        for i in [0, 63, 64, 129] {
            a.insert(i);
        }
        let mut b = BitSet::new(130);
        b.insert(64);
        b.insert(100);
        assert_eq!(a.iter().collect::<Vec<_>>(), vec![0, 63, 64, 129]);
        assert_eq!(a.common(&b).collect::<Vec<_>>(), vec![64]);
        assert!(a.meets(&b));
        a.subtract(&b);
        assert!(!a.contains(64) && a.contains(129));
        a.union_with(&b);
        assert!(a.contains(100));
        assert_eq!(BitSet::full(70).iter().count(), 70);
        assert!(BitSet::new(5).is_empty());
    }
}

//! A map for the few entries a lock watch has (its waiters, its keys): a boxed slice
//! searched in order, sized to its entries. Most watches follow one key and no waiter; a
//! `HashMap` allocates room for four, a `Vec` keeps a capacity word, and a client may
//! follow 100,000 locks, so the one entry is kept in an allocation of its own size and an
//! empty map is two words that allocate nothing. Inserting and removing reallocate: the
//! maps are small, and they change when a waiter or a key comes or goes, not per event.

use std::borrow::Borrow;

/// A map kept as a boxed slice of pairs; see the module docs.
#[derive(Debug)]
pub(crate) struct SmallMap<K, V> {
    entries: Box<[(K, V)]>,
}

impl<K, V> Default for SmallMap<K, V> {
    fn default() -> Self {
        Self {
            entries: Box::default(),
        }
    }
}

impl<K: Eq, V> SmallMap<K, V> {
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Inserts or replaces `key`'s value.
    pub(crate) fn insert(&mut self, key: K, value: V) {
        if let Some(slot) = self.entries.iter_mut().find(|(k, _)| *k == key) {
            slot.1 = value;
            return;
        }
        let mut entries = std::mem::take(&mut self.entries).into_vec();
        entries.reserve_exact(1);
        entries.push((key, value));
        self.entries = entries.into_boxed_slice();
    }

    pub(crate) fn remove<Q>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        let at = self.entries.iter().position(|(k, _)| k.borrow() == key)?;
        let mut entries = std::mem::take(&mut self.entries).into_vec();
        let (_, value) = entries.swap_remove(at);
        self.entries = entries.into_boxed_slice();
        Some(value)
    }

    pub(crate) fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        self.entries
            .iter()
            .find(|(k, _)| k.borrow() == key)
            .map(|(_, v)| v)
    }

    pub(crate) fn get_mut<Q>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        self.entries
            .iter_mut()
            .find(|(k, _)| k.borrow() == key)
            .map(|(_, v)| v)
    }

    pub(crate) fn values(&self) -> impl Iterator<Item = &V> {
        self.entries.iter().map(|(_, v)| v)
    }

    pub(crate) fn values_mut(&mut self) -> impl Iterator<Item = &mut V> {
        self.entries.iter_mut().map(|(_, v)| v)
    }

    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = (&K, &mut V)> {
        self.entries.iter_mut().map(|(k, v)| (&*k, v))
    }

    pub(crate) fn clear(&mut self) {
        self.entries = Box::default();
    }
}

#[cfg(test)]
mod tests {
    use super::SmallMap;

    #[test]
    fn behaves_as_a_map() {
        let mut map: SmallMap<Vec<u8>, u32> = SmallMap::default();
        assert!(map.is_empty());
        map.insert(b"a".to_vec(), 1);
        map.insert(b"b".to_vec(), 2);
        map.insert(b"a".to_vec(), 3);
        assert_eq!(map.get(b"a".as_slice()), Some(&3));
        assert_eq!(map.values().sum::<u32>(), 5);
        if let Some(v) = map.get_mut(b"b".as_slice()) {
            *v = 4;
        }
        assert_eq!(map.remove(b"b".as_slice()), Some(4));
        assert_eq!(map.remove(b"b".as_slice()), None);
        assert_eq!(map.remove(b"a".as_slice()), Some(3));
        assert!(map.is_empty());
    }
}

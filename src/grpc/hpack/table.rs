//! HPACK's header tables: the static table (RFC 7541, Appendix A) and the dynamic table a
//! decoder keeps in step with the peer's encoder (section 2.3.2, 4).

use std::collections::VecDeque;

/// The static table; HPACK index `i` is `STATIC[i - 1]`.
pub const STATIC: [(&[u8], &[u8]); 61] = [
    (b":authority", b""),
    (b":method", b"GET"),
    (b":method", b"POST"),
    (b":path", b"/"),
    (b":path", b"/index.html"),
    (b":scheme", b"http"),
    (b":scheme", b"https"),
    (b":status", b"200"),
    (b":status", b"204"),
    (b":status", b"206"),
    (b":status", b"304"),
    (b":status", b"400"),
    (b":status", b"404"),
    (b":status", b"500"),
    (b"accept-charset", b""),
    (b"accept-encoding", b"gzip, deflate"),
    (b"accept-language", b""),
    (b"accept-ranges", b""),
    (b"accept", b""),
    (b"access-control-allow-origin", b""),
    (b"age", b""),
    (b"allow", b""),
    (b"authorization", b""),
    (b"cache-control", b""),
    (b"content-disposition", b""),
    (b"content-encoding", b""),
    (b"content-language", b""),
    (b"content-length", b""),
    (b"content-location", b""),
    (b"content-range", b""),
    (b"content-type", b""),
    (b"cookie", b""),
    (b"date", b""),
    (b"etag", b""),
    (b"expect", b""),
    (b"expires", b""),
    (b"from", b""),
    (b"host", b""),
    (b"if-match", b""),
    (b"if-modified-since", b""),
    (b"if-none-match", b""),
    (b"if-range", b""),
    (b"if-unmodified-since", b""),
    (b"last-modified", b""),
    (b"link", b""),
    (b"location", b""),
    (b"max-forwards", b""),
    (b"proxy-authenticate", b""),
    (b"proxy-authorization", b""),
    (b"range", b""),
    (b"referer", b""),
    (b"refresh", b""),
    (b"retry-after", b""),
    (b"server", b""),
    (b"set-cookie", b""),
    (b"strict-transport-security", b""),
    (b"transfer-encoding", b""),
    (b"user-agent", b""),
    (b"vary", b""),
    (b"via", b""),
    (b"www-authenticate", b""),
];

/// Where `name` (and possibly `value`) sits in the static table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StaticMatch {
    /// Name and value: the field is this index alone.
    Field(usize),
    /// Only the name.
    Name(usize),
}

/// The static table's entry for `name`, preferring one whose value matches too.
pub fn find_static(name: &[u8], value: &[u8]) -> Option<StaticMatch> {
    // Entries sharing a name are adjacent, so one forward scan from the first finds them all.
    let first = STATIC.iter().position(|(n, _)| *n == name)?;
    STATIC[first..]
        .iter()
        .take_while(|(n, _)| *n == name)
        .position(|(_, v)| *v == value)
        .map_or(Some(StaticMatch::Name(first + 1)), |i| {
            Some(StaticMatch::Field(first + i + 1))
        })
}

/// Bytes an entry counts for in a table's size: its name, its value and 32 (section 4.1).
pub fn entry_size(name: &[u8], value: &[u8]) -> usize {
    name.len() + value.len() + 32
}

#[derive(Debug)]
struct Entry {
    name: Box<[u8]>,
    value: Box<[u8]>,
}

/// The dynamic table: newest entry first, evicting the oldest to stay within `max_size`.
#[derive(Debug)]
pub struct DynamicTable {
    entries: VecDeque<Entry>,
    size: usize,
    max_size: usize,
}

impl DynamicTable {
    /// An empty table that may hold `max_size` bytes.
    pub fn new(max_size: usize) -> DynamicTable {
        DynamicTable {
            entries: VecDeque::new(),
            size: 0,
            max_size,
        }
    }

    /// Entry `i` counted from the newest (0), as HPACK index `62 + i` addresses it.
    pub fn get(&self, i: usize) -> Option<(&[u8], &[u8])> {
        self.entries.get(i).map(|e| (&e.name[..], &e.value[..]))
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the table holds nothing.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Current size in HPACK's accounting.
    #[cfg(test)]
    pub fn size(&self) -> usize {
        self.size
    }

    /// Adds an entry, evicting the oldest ones to make room; an entry larger than the whole
    /// table empties it and is not kept (section 4.4).
    pub fn insert(&mut self, name: &[u8], value: &[u8]) {
        let size = entry_size(name, value);
        if size > self.max_size {
            self.entries.clear();
            self.size = 0;
            return;
        }
        self.evict_to(self.max_size - size);
        self.entries.push_front(Entry {
            name: name.into(),
            value: value.into(),
        });
        self.size += size;
    }

    /// Changes the maximum size, evicting what no longer fits (section 4.3).
    pub fn set_max_size(&mut self, max_size: usize) {
        self.max_size = max_size;
        self.evict_to(max_size);
    }

    fn evict_to(&mut self, limit: usize) {
        while self.size > limit {
            match self.entries.pop_back() {
                Some(old) => self.size -= entry_size(&old.name, &old.value),
                None => {
                    self.size = 0;
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_lookup_prefers_a_full_match() {
        assert_eq!(
            find_static(b":method", b"POST"),
            Some(StaticMatch::Field(3))
        );
        assert_eq!(find_static(b":method", b"PUT"), Some(StaticMatch::Name(2)));
        assert_eq!(
            find_static(b":status", b"500"),
            Some(StaticMatch::Field(14))
        );
        assert_eq!(find_static(b":authority", b"x"), Some(StaticMatch::Name(1)));
        assert_eq!(find_static(b"te", b"trailers"), None);
        assert_eq!(
            find_static(b"www-authenticate", b""),
            Some(StaticMatch::Field(61))
        );
    }

    #[test]
    fn evicts_oldest_first_and_drops_oversized_entries() {
        let mut table = DynamicTable::new(100);
        table.insert(b"a", b"1"); // 34
        table.insert(b"b", b"2"); // 34, total 68
        table.insert(b"c", b"3"); // 34: evicts a
        assert_eq!(table.len(), 2);
        assert_eq!(table.size(), 68);
        assert_eq!(table.get(0), Some((&b"c"[..], &b"3"[..])));
        assert_eq!(table.get(1), Some((&b"b"[..], &b"2"[..])));
        table.set_max_size(40);
        assert_eq!(table.len(), 1);
        assert_eq!(table.get(0), Some((&b"c"[..], &b"3"[..])));
        table.insert(&[b'x'; 10], b""); // 42 > 40: empties the table
        assert!(table.is_empty());
        assert_eq!(table.size(), 0);
    }
}

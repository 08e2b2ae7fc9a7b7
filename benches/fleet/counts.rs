//! What the fleet's API stand-in counts: every request by verb, resource and node with its
//! bytes (request and answer; a watch's bytes as its events go out), the answers' status
//! codes, LISTs without a resourceVersion, the watches open per node, and requests per second
//! of the run. A scenario takes a [`Tally`] before and after and reads the difference.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Instant;

/// A request's verb, as the API server's audit log names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Verb {
    Get,
    List,
    Watch,
    Create,
    Update,
    Patch,
    Apply,
    Delete,
    Other,
}

impl Verb {
    pub fn name(self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Watch => "watch",
            Verb::Create => "create",
            Verb::Update => "update",
            Verb::Patch => "patch",
            Verb::Apply => "apply",
            Verb::Delete => "delete",
            Verb::Other => "other",
        }
    }

    /// Whether the verb changes something.
    pub fn writes(self) -> bool {
        matches!(
            self,
            Verb::Create | Verb::Update | Verb::Patch | Verb::Apply | Verb::Delete
        )
    }
}

/// Requests, those refused (an answer of 400 or above) and bytes.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sum {
    pub requests: u64,
    pub refused: u64,
    pub bytes: u64,
}

/// Everything counted up to a moment.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    /// By (node index, verb, resource).
    pub by: HashMap<(usize, Verb, &'static str), Sum>,
    /// Answers by status code.
    pub codes: BTreeMap<u16, u64>,
    /// LISTs without a resourceVersion, per node.
    pub bare_lists: Vec<u64>,
    /// Requests in each second of the run.
    pub per_second: Vec<u32>,
    /// Every request as (second of the run, node index, verb, resource), in order: who sent
    /// what when, to tell a herd of nodes from one node's burst.
    pub log: Vec<(u32, usize, Verb, &'static str)>,
}

impl Tally {
    /// What happened between `earlier` and this one.
    pub fn since(&self, earlier: &Tally) -> Tally {
        let mut by = self.by.clone();
        for (key, sum) in &earlier.by {
            if let Some(now) = by.get_mut(key) {
                now.requests -= sum.requests;
                now.refused -= sum.refused;
                now.bytes -= sum.bytes;
            }
        }
        let mut codes = self.codes.clone();
        for (code, n) in &earlier.codes {
            if let Some(now) = codes.get_mut(code) {
                *now -= n;
            }
        }
        Tally {
            by,
            codes,
            bare_lists: self
                .bare_lists
                .iter()
                .zip(&earlier.bare_lists)
                .map(|(a, b)| a - b)
                .collect(),
            per_second: self.per_second.clone(),
            log: self.log[earlier.log.len()..].to_vec(),
        }
    }

    /// Sums by (verb, resource) over all nodes.
    pub fn by_call(&self) -> BTreeMap<(Verb, &'static str), Sum> {
        let mut out: BTreeMap<(Verb, &'static str), Sum> = BTreeMap::new();
        for ((_, verb, resource), sum) in &self.by {
            let entry = out.entry((*verb, *resource)).or_default();
            entry.requests += sum.requests;
            entry.refused += sum.refused;
            entry.bytes += sum.bytes;
        }
        out
    }

    /// All requests, writes taken (not refused), LISTs and bytes.
    pub fn totals(&self) -> (u64, u64, u64, u64) {
        self.by
            .iter()
            .fold((0, 0, 0, 0), |(r, w, l, b), ((_, verb, _), sum)| {
                (
                    r + sum.requests,
                    w + if verb.writes() {
                        sum.requests - sum.refused
                    } else {
                        0
                    },
                    l + if *verb == Verb::List { sum.requests } else { 0 },
                    b + sum.bytes,
                )
            })
    }

    /// Writes taken per node index.
    pub fn writes_by_node(&self, nodes: usize) -> Vec<u64> {
        let mut out = vec![0; nodes];
        for ((node, verb, _), sum) in &self.by {
            if verb.writes() && *node < nodes {
                out[*node] += sum.requests - sum.refused;
            }
        }
        out
    }

    /// The requests of second `at` (within this tally's log) by (verb, resource), most
    /// first: what made a busy second.
    pub fn calls_in(&self, at: usize) -> Vec<((Verb, &'static str), u32)> {
        let mut by_call: BTreeMap<(Verb, &'static str), u32> = BTreeMap::new();
        for &(second, _, verb, resource) in &self.log {
            if second as usize == at {
                *by_call.entry((verb, resource)).or_default() += 1;
            }
        }
        let mut calls: Vec<_> = by_call.into_iter().collect();
        calls.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        calls
    }

    /// Per node, the seconds of the run it sent requests in from second `from` (inclusive)
    /// to `to` (exclusive), with the requests in each.
    pub fn node_seconds(&self, from: usize, to: usize) -> BTreeMap<usize, BTreeMap<u32, u32>> {
        let mut out: BTreeMap<usize, BTreeMap<u32, u32>> = BTreeMap::new();
        for &(at, node, _, _) in &self.log {
            if (from..to).contains(&(at as usize)) {
                *out.entry(node).or_default().entry(at).or_default() += 1;
            }
        }
        out
    }

    /// Requests per second from second `from` (inclusive) to `to` (exclusive).
    pub fn seconds(&self, from: usize, to: usize) -> Vec<u32> {
        (from..to)
            .map(|s| self.per_second.get(s).copied().unwrap_or(0))
            .collect()
    }
}

/// The counters, shared by the stand-in's handlers.
pub struct Counts {
    start: Instant,
    index: HashMap<String, usize>,
    tally: Mutex<Tally>,
    /// Watches open now, per node (the last slot: requests naming no node).
    open: Mutex<Vec<i64>>,
}

/// Closes a watch in the count when dropped.
pub struct OpenWatch<'a> {
    counts: &'a Counts,
    node: usize,
}

impl Drop for OpenWatch<'_> {
    fn drop(&mut self) {
        if let Ok(mut open) = self.counts.open.lock() {
            open[self.node] -= 1;
        }
    }
}

impl Counts {
    pub fn new(nodes: &[String]) -> Counts {
        Counts {
            start: Instant::now(),
            index: nodes
                .iter()
                .enumerate()
                .map(|(i, n)| (n.clone(), i))
                .collect(),
            tally: Mutex::new(Tally {
                bare_lists: vec![0; nodes.len() + 1],
                ..Tally::default()
            }),
            open: Mutex::new(vec![0; nodes.len() + 1]),
        }
    }

    fn node(&self, name: &str) -> usize {
        self.index.get(name).copied().unwrap_or(self.index.len())
    }

    /// The second of the run now.
    pub fn second(&self) -> u64 {
        self.start.elapsed().as_secs()
    }

    /// One request answered with `code`, `bytes` both ways.
    pub fn record(&self, node: &str, verb: Verb, resource: &'static str, code: u16, bytes: usize) {
        let node = self.node(node);
        let second = usize::try_from(self.second()).unwrap_or(usize::MAX);
        let mut tally = self.tally.lock().expect("tally");
        let sum = tally.by.entry((node, verb, resource)).or_default();
        sum.requests += 1;
        sum.refused += u64::from(code >= 400);
        sum.bytes += bytes as u64;
        *tally.codes.entry(code).or_default() += 1;
        if tally.per_second.len() <= second {
            tally.per_second.resize(second + 1, 0);
        }
        tally.per_second[second] += 1;
        let at = u32::try_from(second).unwrap_or(u32::MAX);
        tally.log.push((at, node, verb, resource));
    }

    /// Bytes a watch sent.
    pub fn bytes(&self, node: &str, resource: &'static str, bytes: usize) {
        let node = self.node(node);
        let mut tally = self.tally.lock().expect("tally");
        tally
            .by
            .entry((node, Verb::Watch, resource))
            .or_default()
            .bytes += bytes as u64;
    }

    pub fn list_without_version(&self, node: &str) {
        let node = self.node(node);
        self.tally.lock().expect("tally").bare_lists[node] += 1;
    }

    /// A watch opened by `node`, counted open until the guard drops.
    pub fn watch_opened(&self, node: &str) -> OpenWatch<'_> {
        let node = self.node(node);
        self.open.lock().expect("open")[node] += 1;
        OpenWatch { counts: self, node }
    }

    /// Watches open now, per node.
    pub fn open_watches(&self) -> Vec<i64> {
        let open = self.open.lock().expect("open");
        open[..open.len() - 1].to_vec()
    }

    /// Everything counted so far.
    pub fn tally(&self) -> Tally {
        self.tally.lock().expect("tally").clone()
    }
}

//! How a report is cut: its rows (`--by`), how deep stacks go
//! (`--stack-depth`), and which locks and callers it keeps (`--lock-filter`,
//! `--caller`). Applied when rows are built, so totals, JSON and CSV agree.
use super::{
    callers::{ByKey, CallerRow, frame_matches},
    report::LockRow,
};

/// Frames shown per stack unless `--stack-depth` says otherwise (perf's
/// `--max-stack` default).
pub const DEFAULT_STACK_DEPTH: usize = 8;

/// `--lock-filter` entries: an address, or a piece of the row's name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LockMatch {
    Address(u64),
    Name(String),
}

impl std::str::FromStr for LockMatch {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if text.is_empty() {
            return Err("--lock-filter: an empty entry".to_owned());
        }
        match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
            Some(hex) => u64::from_str_radix(hex, 16)
                .map(Self::Address)
                .map_err(|_| format!("--lock-filter {text}: not a hexadecimal address")),
            None => Ok(Self::Name(text.to_owned())),
        }
    }
}

#[derive(Clone, Debug)]
pub struct ReportView {
    pub by: ByKey,
    pub stack_depth: usize,
    /// `--caller GLOB`: only waits whose stack has a matching frame.
    pub caller: Option<glob::Pattern>,
    /// `--lock-filter`: only these locks (any of them); empty: all.
    pub locks: Vec<LockMatch>,
}

impl Default for ReportView {
    fn default() -> Self {
        Self {
            by: ByKey::Lock,
            stack_depth: DEFAULT_STACK_DEPTH,
            caller: None,
            locks: Vec::new(),
        }
    }
}

impl ReportView {
    /// Whether `--lock-filter` keeps the row.
    pub fn keeps_lock(&self, row: &LockRow) -> bool {
        self.locks.is_empty()
            || self.locks.iter().any(|m| match m {
                LockMatch::Address(addr) => row.lock_addr == *addr,
                LockMatch::Name(part) => row.name.contains(part.as_str()),
            })
    }

    /// Whether `--caller` keeps the caller row.
    pub fn keeps_caller(&self, row: &CallerRow) -> bool {
        self.caller
            .as_ref()
            .is_none_or(|glob| row.stack.iter().any(|frame| frame_matches(glob, frame)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::sample;

    #[test]
    fn lock_filters_take_addresses_and_names() {
        assert_eq!("0xff10".parse(), Ok(LockMatch::Address(0xff10)));
        assert_eq!("rq_lock".parse(), Ok(LockMatch::Name("rq_lock".into())));
        assert!("0xzz".parse::<LockMatch>().unwrap_err().contains("0xzz"));
        assert!(" ".parse::<LockMatch>().is_err());
        let row = sample().locks.remove(0);
        let view = |locks: &[&str]| ReportView {
            locks: locks.iter().map(|l| l.parse().unwrap()).collect(),
            ..ReportView::default()
        };
        assert!(view(&[]).keeps_lock(&row));
        assert!(view(&["pipe:[4242]"]).keeps_lock(&row));
        assert!(view(&["0xffff888001234000"]).keeps_lock(&row));
        assert!(!view(&["rq_lock", "0x1"]).keeps_lock(&row));
    }

    #[test]
    fn a_caller_glob_keeps_stacks_with_a_matching_frame() {
        let row = CallerRow {
            class: None,
            stack: vec!["anon_pipe_write+0x50".into(), "vfs_write+0x2a4".into()],
            acquisitions: None,
            contentions: 1,
            wait_total_ns: 1,
            wait_max_ns: 1,
            hold_total_ns: None,
            margin: None,
        };
        let view = |glob: &str| ReportView {
            caller: Some(glob::Pattern::new(glob).unwrap()),
            ..ReportView::default()
        };
        assert!(ReportView::default().keeps_caller(&row));
        assert!(view("vfs_write").keeps_caller(&row));
        assert!(!view("anon_pipe_read").keeps_caller(&row));
    }
}

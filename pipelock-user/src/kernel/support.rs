//! Which program types this kernel accepted when pipelock tried them: the
//! one kernel fact that can only be learnt by loading programs (see
//! `crate::bpf::support_check`), recorded as text beside captured facts.
use std::fmt;

/// What a live load/attach check of one program type found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Support {
    /// A test program of this type loaded and attached.
    Works,
    /// The kernel refused it; the reason is the kernel's error.
    Refused(String),
    /// Not tried (facts read from a fixture, or a prerequisite is missing).
    NotTested(String),
}

impl Support {
    pub fn works(&self) -> bool {
        matches!(self, Self::Works)
    }
}

impl fmt::Display for Support {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Works => f.write_str("yes"),
            Self::Refused(why) => write!(f, "refused: {why}"),
            Self::NotTested(why) => write!(f, "not tested: {why}"),
        }
    }
}

/// Live results for each program type pipelock can use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttachSupport {
    pub fentry: Support,
    pub kprobe: Support,
    pub tracepoint: Support,
    pub tp_btf: Support,
}

impl AttachSupport {
    const FIELDS: [&str; 4] = ["fentry", "kprobe", "tracepoint", "tp_btf"];

    fn fields(&self) -> [&Support; 4] {
        [&self.fentry, &self.kprobe, &self.tracepoint, &self.tp_btf]
    }

    /// `name: outcome` lines, read back by [`Self::from_text`].
    pub fn to_text(&self) -> String {
        Self::FIELDS
            .iter()
            .zip(self.fields())
            .map(|(name, support)| format!("{name}: {support}\n"))
            .collect()
    }

    pub fn from_text(text: &str) -> Option<Self> {
        let support = |field: &str| {
            let line = text
                .lines()
                .find_map(|l| l.strip_prefix(field)?.strip_prefix(": "))?;
            if line == "yes" {
                Some(Support::Works)
            } else if let Some(why) = line.strip_prefix("refused: ") {
                Some(Support::Refused(why.to_owned()))
            } else {
                line.strip_prefix("not tested: ")
                    .map(|why| Support::NotTested(why.to_owned()))
            }
        };
        Some(Self {
            fentry: support("fentry")?,
            kprobe: support("kprobe")?,
            tracepoint: support("tracepoint")?,
            tp_btf: support("tp_btf")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn support_round_trips_through_text() {
        let support = AttachSupport {
            fentry: Support::Refused("the BPF_PROG_LOAD syscall returned EPERM".into()),
            kprobe: Support::NotTested("no target".into()),
            tracepoint: Support::Works,
            tp_btf: Support::Works,
        };
        assert_eq!(AttachSupport::from_text(&support.to_text()), Some(support));
        assert_eq!(AttachSupport::from_text("fentry: yes\n"), None);
    }
}

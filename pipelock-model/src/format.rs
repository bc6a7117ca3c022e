//! The version of pipelock's result files. Every file pipelock writes for
//! itself to read back (`trace --json`, `run --json`, `ab --json`) carries
//! it, so a file of another version, or not pipelock's at all, is refused
//! with one line saying which, instead of reading as zeros.
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The format this pipelock writes and reads. Raised whenever a field
/// pipelock reads back changes meaning or shape.
pub const FORMAT: u32 = 2;

/// The `format` field: written as [`FORMAT`], read only when it is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FormatVersion;

impl Serialize for FormatVersion {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u32(FORMAT)
    }
}

impl<'de> Deserialize<'de> for FormatVersion {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match u32::deserialize(deserializer)? {
            FORMAT => Ok(Self),
            other => Err(serde::de::Error::custom(format!(
                "written in result format {other}; this pipelock reads format {FORMAT}"
            ))),
        }
    }
}

/// Just the `format` field of a result file, to say why a file is refused
/// before its other fields are read.
#[derive(Deserialize)]
struct Head {
    format: Option<u32>,
}

/// Why `json` (pipelock's own result, by its looks) cannot be read by this
/// version, if it cannot: no `format` field (a file of an older pipelock,
/// or of another program) or another format.
pub fn refusal(json: &str) -> Option<String> {
    match serde_json::from_str::<Head>(json) {
        Err(_) => None,
        Ok(Head { format: None }) => Some(format!(
            "no result format field: written by a pipelock older than format {FORMAT}, or by another program \
             (record it again with this pipelock)"
        )),
        Ok(Head { format: Some(FORMAT) }) => None,
        Ok(Head { format: Some(other) }) => Some(format!(
            "written in result format {other}; this pipelock reads format {FORMAT}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize, Deserialize)]
    struct Doc {
        format: FormatVersion,
    }

    #[test]
    fn only_this_format_reads_back() {
        let json = serde_json::to_string(&Doc {
            format: FormatVersion,
        })
        .unwrap();
        assert_eq!(json, format!("{{\"format\":{FORMAT}}}"));
        assert!(serde_json::from_str::<Doc>(&json).is_ok());
        let older = serde_json::from_str::<Doc>("{\"format\":1}").err().unwrap();
        assert!(older.to_string().contains("result format 1"), "{older}");
        assert!(refusal(&json).is_none());
        assert!(
            refusal("{\"locks\": []}")
                .unwrap()
                .contains("no result format field")
        );
        assert!(refusal("{\"format\": 7}").unwrap().contains("format 7"));
        // Not JSON at all is for the caller's parser to say.
        assert!(refusal("{").is_none());
    }
}

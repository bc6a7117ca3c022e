//! `serve --web-config FILE`: TLS and basic authentication, configured the
//! way every official Prometheus exporter is (the exporter-toolkit's web
//! configuration file), so a fleet's existing files and habits carry over.
//!
//! ```yaml
//! tls_server_config:
//!   cert_file: /etc/pipelock/tls.crt
//!   key_file: /etc/pipelock/tls.key
//!   client_auth_type: RequireAndVerifyClientCert   # optional
//!   client_ca_file: /etc/pipelock/scrapers-ca.crt  # with a verifying client_auth_type
//!   min_version: TLS12                             # optional: TLS12 (default) or TLS13
//! basic_auth_users:
//!   prometheus: $2y$10$...                         # bcrypt hashes (htpasswd -nBC 10 "")
//! ```
//!
//! Everything is read and checked before a program is attached: a file that
//! does not parse, a field pipelock does not know, a certificate or key that
//! cannot be read or do not match, a hash that is not bcrypt: one error line.
//! Relative paths are relative to the file's directory, as in the toolkit.
use std::{
    collections::{BTreeMap, HashSet},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use rustls::{
    ServerConfig,
    pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject},
    server::WebPkiClientVerifier,
};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::Error;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct WebConfigFile {
    tls_server_config: Option<TlsFile>,
    basic_auth_users: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TlsFile {
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
    client_ca_file: Option<PathBuf>,
    #[serde(default)]
    client_auth_type: String,
    min_version: Option<String>,
    max_version: Option<String>,
}

/// What `--web-config` asks for.
pub struct WebConfig {
    pub tls: Option<Arc<ServerConfig>>,
    pub users: Option<Arc<Users>>,
}

impl WebConfig {
    /// Plain HTTP, no authentication.
    pub fn none() -> Self {
        Self {
            tls: None,
            users: None,
        }
    }

    pub fn load(path: &Path) -> Result<Self, Error> {
        let bad = |what: String| Error::Usage(format!("--web-config {}: {what}", path.display()));
        let text = std::fs::read_to_string(path).map_err(|err| bad(format!("cannot read it ({err})")))?;
        // An empty file is an empty map to the toolkit: plain HTTP, no auth.
        let file: WebConfigFile = if text.trim().is_empty() {
            WebConfigFile::default()
        } else {
            serde_yaml_ng::from_str(&text).map_err(|err| bad(err.to_string()))?
        };
        let dir = path.parent().unwrap_or(Path::new("."));
        let tls = file
            .tls_server_config
            .map(|tls| tls_config(&tls, dir))
            .transpose()
            .map_err(bad)?;
        let users = file.basic_auth_users.map(Users::new).transpose().map_err(bad)?;
        Ok(Self {
            tls: tls.map(Arc::new),
            users: users.map(Arc::new),
        })
    }
}

fn version(name: &str) -> Result<&'static rustls::SupportedProtocolVersion, String> {
    match name {
        "TLS12" => Ok(&rustls::version::TLS12),
        "TLS13" => Ok(&rustls::version::TLS13),
        "TLS10" | "TLS11" => Err(format!("{name}: pipelock speaks TLS 1.2 and 1.3 only")),
        _ => Err(format!("{name}: not a TLS version (TLS12 or TLS13)")),
    }
}

fn tls_config(tls: &TlsFile, dir: &Path) -> Result<ServerConfig, String> {
    let resolve = |p: &PathBuf| dir.join(p);
    let (Some(cert_file), Some(key_file)) = (&tls.cert_file, &tls.key_file) else {
        return Err("tls_server_config needs both cert_file and key_file".to_owned());
    };
    let (cert_file, key_file) = (resolve(cert_file), resolve(key_file));
    let certs = CertificateDer::pem_file_iter(&cert_file)
        .and_then(Iterator::collect::<Result<Vec<_>, _>>)
        .map_err(|err| format!("cert_file {}: {err}", cert_file.display()))?;
    if certs.is_empty() {
        return Err(format!("cert_file {}: no certificate in it", cert_file.display()));
    }
    let key = PrivateKeyDer::from_pem_file(&key_file)
        .map_err(|err| format!("key_file {}: {err}", key_file.display()))?;

    let first = tls.min_version.as_deref().unwrap_or("TLS12");
    let last = tls.max_version.as_deref().unwrap_or("TLS13");
    let (first, last) = (version(first)?, version(last)?);
    let all = [&rustls::version::TLS12, &rustls::version::TLS13];
    let position = |v: &rustls::SupportedProtocolVersion| all.iter().position(|a| a.version == v.version);
    let versions: Vec<_> = all[position(first).unwrap_or(0)..=position(last).unwrap_or(1)].to_vec();
    if versions.is_empty() {
        return Err("min_version is newer than max_version".to_owned());
    }

    // ring, not aws-lc-rs: the build needs no cmake or C toolchain beyond
    // cc. rustls marks it deprecated for lacking post-quantum key exchange,
    // which a scrape on a trusted network does not need.
    #[allow(deprecated)]
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&versions)
        .map_err(|err| err.to_string())?;
    let roots = || -> Result<Arc<rustls::RootCertStore>, String> {
        let Some(ca_file) = &tls.client_ca_file else {
            return Err(format!(
                "client_auth_type {} needs client_ca_file (the CA that signs the scrapers' certificates)",
                tls.client_auth_type
            ));
        };
        let ca_file = resolve(ca_file);
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(&ca_file)
            .map_err(|err| format!("client_ca_file {}: {err}", ca_file.display()))?
        {
            let cert = cert.map_err(|err| format!("client_ca_file {}: {err}", ca_file.display()))?;
            roots
                .add(cert)
                .map_err(|err| format!("client_ca_file {}: {err}", ca_file.display()))?;
        }
        Ok(Arc::new(roots))
    };
    let builder = match tls.client_auth_type.as_str() {
        "" | "NoClientCert" => {
            if tls.client_ca_file.is_some() {
                return Err(
                    "client_ca_file is set but client_auth_type asks for no client certificate \
                            (VerifyClientCertIfGiven or RequireAndVerifyClientCert)"
                        .to_owned(),
                );
            }
            builder.with_no_client_auth()
        }
        kind @ ("VerifyClientCertIfGiven" | "RequireAndVerifyClientCert") => {
            let verifier = WebPkiClientVerifier::builder_with_provider(roots()?, provider);
            let verifier = if kind == "VerifyClientCertIfGiven" {
                verifier.allow_unauthenticated()
            } else {
                verifier
            };
            builder.with_client_cert_verifier(verifier.build().map_err(|err| err.to_string())?)
        }
        "RequestClientCert" | "RequireAnyClientCert" => {
            return Err(format!(
                "client_auth_type {}: pipelock checks every client certificate it asks for; \
                 use VerifyClientCertIfGiven or RequireAndVerifyClientCert",
                tls.client_auth_type
            ));
        }
        other => {
            return Err(format!(
                "client_auth_type {other}: not one of NoClientCert, VerifyClientCertIfGiven, \
                 RequireAndVerifyClientCert"
            ));
        }
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|err| format!("cert_file/key_file: {err}"))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// Memoised successes: a Prometheus sends the same credentials every scrape,
/// and bcrypt is slow on purpose (tens of ms at cost 10).
const REMEMBERED: usize = 64;

/// `basic_auth_users`: names and their bcrypt hashes.
pub struct Users {
    hashes: BTreeMap<String, String>,
    /// SHA-256 of (name, password, hash) of credentials that passed.
    passed: Mutex<HashSet<[u8; 32]>>,
}

/// A bcrypt hash to spend the same time on for an unknown user as for a
/// known one, so that timing does not tell which names exist.
const UNKNOWN_USER: &str = "$2b$10$CwTycUXWue0Thq9StjUM0uJ8DPLKXt1FYlwYpQW12fu3u1qvPi0N6";

impl Users {
    fn new(hashes: BTreeMap<String, String>) -> Result<Self, String> {
        for (user, hash) in &hashes {
            if user.contains(':') {
                return Err(format!("basic_auth_users: {user}: a user name cannot hold ':'"));
            }
            hash.parse::<bcrypt::HashParts>()
                .map_err(|err| format!("basic_auth_users: {user}: not a bcrypt hash ({err})"))?;
        }
        Ok(Self {
            hashes,
            passed: Mutex::new(HashSet::new()),
        })
    }

    fn digest(&self, user: &str, password: &str, hash: &str) -> [u8; 32] {
        let mut sha = Sha256::new();
        for part in [user, password, hash] {
            sha.update((part.len() as u64).to_le_bytes());
            sha.update(part.as_bytes());
        }
        sha.finalize().into()
    }

    /// The user and password of an `Authorization: Basic` value.
    fn credentials(authorization: Option<&str>) -> Option<(String, String)> {
        use base64::Engine as _;
        let encoded = authorization?.strip_prefix("Basic ")?;
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(encoded.trim())
            .ok()?;
        let decoded = String::from_utf8(decoded).ok()?;
        let (user, password) = decoded.split_once(':')?;
        Some((user.to_owned(), password.to_owned()))
    }

    /// Whether these credentials passed before (cheap: no bcrypt).
    pub fn remembered(&self, authorization: Option<&str>) -> bool {
        let Some((user, password)) = Self::credentials(authorization) else {
            return false;
        };
        self.hashes.get(&user).is_some_and(|hash| {
            let digest = self.digest(&user, &password, hash);
            self.passed.lock().is_ok_and(|passed| passed.contains(&digest))
        })
    }

    /// Whether an `Authorization` header's value names a user and its
    /// password. Blocking (bcrypt): call it off the async threads.
    pub fn allows(&self, authorization: Option<&str>) -> bool {
        if self.remembered(authorization) {
            return true;
        }
        let Some((user, password)) = Self::credentials(authorization) else {
            return false;
        };
        let (hash, known) = match self.hashes.get(&user) {
            Some(hash) => (hash.as_str(), true),
            None => (UNKNOWN_USER, false),
        };
        let digest = self.digest(&user, &password, hash);
        let ok = bcrypt::verify(password, hash).unwrap_or(false) && known;
        if ok && let Ok(mut passed) = self.passed.lock() {
            if passed.len() >= REMEMBERED {
                passed.clear();
            }
            passed.insert(digest);
        }
        ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tempdir() -> PathBuf {
        use std::sync::atomic::{AtomicU32, Ordering};
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "pipelock-web-config-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    fn error_of(text: &str) -> String {
        let path = write(&tempdir(), "web.yml", text);
        match WebConfig::load(&path) {
            Ok(_) => panic!("accepted: {text}"),
            Err(err) => err.to_string(),
        }
    }

    #[test]
    fn bad_files_are_one_clear_line() {
        let unknown = error_of("tls_server_config:\n  cert_file: a\n  key_file: b\n  cipher_suites: [x]\n");
        assert!(unknown.contains("unknown field `cipher_suites`"), "{unknown}");
        let hash = error_of("basic_auth_users:\n  alice: secret\n");
        assert!(hash.contains("alice: not a bcrypt hash"), "{hash}");
        let missing = error_of("tls_server_config:\n  cert_file: nowhere.crt\n  key_file: nowhere.key\n");
        assert!(
            missing.contains("cert_file") && missing.contains("nowhere.crt"),
            "{missing}"
        );
        let half = error_of("tls_server_config:\n  cert_file: a.crt\n");
        assert!(half.contains("needs both cert_file and key_file"), "{half}");
        let yaml = error_of("basic_auth_users: [\n");
        assert!(yaml.starts_with("--web-config "), "{yaml}");
        for err in [unknown, hash, missing, half, yaml] {
            assert!(!err.contains('\n'), "one line: {err}");
        }
    }

    #[test]
    fn an_empty_file_is_plain_http_without_auth() {
        let config = WebConfig::load(&write(&tempdir(), "web.yml", "\n")).unwrap();
        assert!(config.tls.is_none() && config.users.is_none());
    }

    #[test]
    fn basic_auth_checks_the_password_and_remembers_successes() {
        use base64::Engine as _;
        let hash = bcrypt::hash("s3cret", 4).unwrap();
        let users = Users::new(BTreeMap::from([("prometheus".to_owned(), hash)])).unwrap();
        let header = |creds: &str| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(creds)
            )
        };
        assert!(users.allows(Some(&header("prometheus:s3cret"))));
        assert!(users.allows(Some(&header("prometheus:s3cret"))), "remembered");
        assert!(!users.allows(Some(&header("prometheus:wrong"))));
        assert!(!users.allows(Some(&header("nobody:s3cret"))));
        assert!(!users.allows(Some("Bearer abc")));
        assert!(!users.allows(Some("Basic !!!")));
        assert!(!users.allows(None));
        assert!(users.passed.lock().unwrap().len() == 1);
        // The stand-in hash for unknown users is a real one: it costs what a
        // known user's check costs.
        assert_eq!(bcrypt::verify("x", UNKNOWN_USER).ok(), Some(false));
    }
}

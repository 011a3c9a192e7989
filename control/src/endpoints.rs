//! The etcd endpoints an operator names: `--etcd http://h1:2379,http://h2:2379`.

use std::fmt;

/// A non-empty list of etcd client URLs (`http://host:port`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoints(Vec<String>);

/// Why an endpoint list cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EndpointsError {
    /// Nothing was named.
    #[error("no etcd endpoint given (expected http://HOST:PORT[,http://HOST:PORT…])")]
    Empty,
    /// One entry is not an `http://host:port` URL.
    #[error(
        "etcd endpoint {entry:?} is not http://HOST:PORT ({why}); TLS endpoints (https) are not \
         supported yet"
    )]
    Malformed {
        /// The entry as given.
        entry: String,
        /// What is wrong with it.
        why: &'static str,
    },
}

impl Endpoints {
    /// Parses a comma-separated list of `http://host:port` URLs.
    pub fn parse(text: &str) -> Result<Self, EndpointsError> {
        let mut urls = Vec::new();
        for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let malformed = |why| EndpointsError::Malformed {
                entry: entry.to_owned(),
                why,
            };
            let rest = entry
                .strip_prefix("http://")
                .ok_or_else(|| malformed("it does not start with http://"))?;
            let (host, port) = rest
                .rsplit_once(':')
                .ok_or_else(|| malformed("it has no :PORT"))?;
            if host.is_empty() {
                return Err(malformed("it has no host"));
            }
            if port.parse::<u16>().map_or(true, |p| p == 0) {
                return Err(malformed("its port is not a number from 1 to 65535"));
            }
            urls.push(entry.to_owned());
        }
        if urls.is_empty() {
            return Err(EndpointsError::Empty);
        }
        Ok(Self(urls))
    }

    /// The URLs, in the order given.
    pub fn urls(&self) -> &[String] {
        &self.0
    }
}

impl fmt::Display for Endpoints {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.join(","))
    }
}

impl std::str::FromStr for Endpoints {
    type Err = EndpointsError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::parse(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_parse_and_print_back() {
        let e = Endpoints::parse("http://h1:2379, http://10.0.0.2:2379").unwrap();
        assert_eq!(e.urls(), ["http://h1:2379", "http://10.0.0.2:2379"]);
        assert_eq!(e.to_string(), "http://h1:2379,http://10.0.0.2:2379");
    }

    #[test]
    fn bad_entries_are_named() {
        assert_eq!(Endpoints::parse(" , "), Err(EndpointsError::Empty));
        for (text, why) in [
            ("h1:2379", "http://"),
            ("http://h1", ":PORT"),
            ("http://:2379", "no host"),
            ("http://h1:99999", "port"),
            ("https://h1:2379", "http://"),
        ] {
            let err = Endpoints::parse(text).unwrap_err().to_string();
            assert!(err.contains(text) && err.contains(why), "{text}: {err}");
        }
    }
}

//! The commands a supervised fabric takes, on its console or its control
//! socket: what they are and how a line of text names one.

use crate::fabric::launch::DaemonKind;

/// What `help` prints.
pub const HELP: &str = "\
commands (type them here, or run `testbed COMMAND` from another shell):
  status                 every daemon: pid, running or how it ended
  restart ID             start daemon ID again (killed first if it runs)
  restart server ID      the same, when a server and a device share the id
  restart device ID
  help                   this list
  stop                   stop the fabric (as Ctrl-C does; console only)";

/// One command for the supervisor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Every daemon's state.
    Status,
    /// Start a daemon again.
    Restart(Target),
    /// The list of commands.
    Help,
    /// Stop the whole fabric.
    Stop,
}

/// A daemon as a command names it: an id, and its kind when given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// `None`: whichever kind has this id.
    pub kind: Option<DaemonKind>,
    /// The daemon's id in the topology.
    pub id: String,
}

/// Why a line is not a command.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// Nothing but blanks.
    #[error("empty command; `help` lists the commands")]
    Empty,
    /// An unknown first word.
    #[error("unknown command {0:?}; `help` lists the commands")]
    Unknown(String),
    /// `restart` without a daemon.
    #[error("restart what? say `restart ID` (ids are in the table above or in `status`)")]
    MissingTarget,
    /// Words after a complete command.
    #[error("{command}: unexpected {extra:?}; `help` lists the commands")]
    Extra {
        /// The command.
        command: String,
        /// What followed it.
        extra: String,
    },
}

/// Parses one command line.
pub fn parse(line: &str) -> Result<Request, RequestError> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let Some((&first, rest)) = words.split_first() else {
        return Err(RequestError::Empty);
    };
    let simple = |request: Request| {
        if rest.is_empty() {
            Ok(request)
        } else {
            Err(RequestError::Extra {
                command: first.to_owned(),
                extra: rest.join(" "),
            })
        }
    };
    match first {
        "status" => simple(Request::Status),
        "help" | "?" => simple(Request::Help),
        "stop" | "quit" | "exit" => simple(Request::Stop),
        "restart" => parse_target(rest).map(Request::Restart),
        other => Err(RequestError::Unknown(other.to_owned())),
    }
}

/// `ID`, or `KIND ID` with KIND `server`/`pmem-server` or
/// `device`/`fabric-device`.
fn parse_target(words: &[&str]) -> Result<Target, RequestError> {
    let kind_of = |word: &str| match word {
        "server" | "pmem-server" => Some(DaemonKind::PmemServer),
        "device" | "fabric-device" => Some(DaemonKind::FabricDevice),
        _ => None,
    };
    match words {
        [] => Err(RequestError::MissingTarget),
        [id] => Ok(Target {
            kind: None,
            id: (*id).to_owned(),
        }),
        [kind, id] if kind_of(kind).is_some() => Ok(Target {
            kind: kind_of(kind),
            id: (*id).to_owned(),
        }),
        [_, extra @ ..] => Err(RequestError::Extra {
            command: "restart".to_owned(),
            extra: extra.join(" "),
        }),
    }
}

impl Target {
    /// The one daemon among `known` (kind, id) this names, or a message
    /// saying why there is none or more than one.
    pub fn resolve(&self, known: &[(DaemonKind, String)]) -> Result<(DaemonKind, String), String> {
        let matches: Vec<DaemonKind> = known
            .iter()
            .filter(|(kind, id)| *id == self.id && self.kind.is_none_or(|k| k == *kind))
            .map(|(kind, _)| *kind)
            .collect();
        match matches.as_slice() {
            [kind] => Ok((*kind, self.id.clone())),
            [] => {
                let ids: Vec<String> = known
                    .iter()
                    .map(|(kind, id)| format!("{} {id}", kind.program()))
                    .collect();
                let what = self.kind.map_or("daemon", DaemonKind::program);
                Err(format!(
                    "no {what} {:?} in this fabric; it has {}",
                    self.id,
                    ids.join(", ")
                ))
            }
            _ => Err(format!(
                "{id:?} is both a pmem-server and a fabric-device: say `restart server {id}` \
                 or `restart device {id}`",
                id = self.id
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(kind: Option<DaemonKind>, id: &str) -> Request {
        Request::Restart(Target {
            kind,
            id: id.to_owned(),
        })
    }

    #[test]
    fn commands_parse() {
        assert_eq!(parse(" status "), Ok(Request::Status));
        assert_eq!(parse("help"), Ok(Request::Help));
        assert_eq!(parse("stop"), Ok(Request::Stop));
        assert_eq!(parse("restart B"), Ok(target(None, "B")));
        assert_eq!(
            parse("restart server B"),
            Ok(target(Some(DaemonKind::PmemServer), "B"))
        );
        assert_eq!(
            parse("restart fabric-device F1"),
            Ok(target(Some(DaemonKind::FabricDevice), "F1"))
        );
    }

    #[test]
    fn bad_lines_say_what_is_wrong() {
        assert_eq!(parse("   "), Err(RequestError::Empty));
        assert_eq!(parse("restart"), Err(RequestError::MissingTarget));
        assert_eq!(
            parse("reboot A"),
            Err(RequestError::Unknown("reboot".to_owned()))
        );
        assert!(matches!(
            parse("restart A B"),
            Err(RequestError::Extra { .. })
        ));
        assert!(matches!(
            parse("status now"),
            Err(RequestError::Extra { .. })
        ));
    }

    #[test]
    fn a_shared_id_needs_its_kind() {
        let known = vec![
            (DaemonKind::PmemServer, "A".to_owned()),
            (DaemonKind::FabricDevice, "A".to_owned()),
            (DaemonKind::PmemServer, "B".to_owned()),
        ];
        let bare = Target {
            kind: None,
            id: "A".to_owned(),
        };
        let err = bare.resolve(&known).unwrap_err();
        assert!(err.contains("restart server A"), "{err}");
        let server = Target {
            kind: Some(DaemonKind::FabricDevice),
            id: "A".to_owned(),
        };
        assert_eq!(
            server.resolve(&known),
            Ok((DaemonKind::FabricDevice, "A".to_owned()))
        );
        let b = Target {
            kind: None,
            id: "B".to_owned(),
        };
        assert_eq!(
            b.resolve(&known),
            Ok((DaemonKind::PmemServer, "B".to_owned()))
        );
        let none = Target {
            kind: None,
            id: "Z".to_owned(),
        };
        let err = none.resolve(&known).unwrap_err();
        assert!(err.contains("pmem-server B"), "{err}");
    }
}

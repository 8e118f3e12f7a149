//! What `warren` exits with. Documented in `--help` (args.rs) and docs/cli.md; keep the three in step.

use warren_client::ErrorKind;

pub const OK: i32 = 0;
pub const ERROR: i32 = 1;
/// clap exits with 2 on its own for usage errors; we use it for bad values it cannot check.
pub const USAGE: i32 = 2;
pub const NOT_FOUND: i32 = 3;
pub const AUTH: i32 = 4;
pub const REFUSED: i32 = 5;
pub const UNREACHABLE: i32 = 6;

/// The exit code for a failure of the given kind.
pub fn for_kind(kind: ErrorKind) -> i32 {
    match kind {
        ErrorKind::NotFound => NOT_FOUND,
        ErrorKind::Unauthorized => AUTH,
        ErrorKind::Refused => REFUSED,
        ErrorKind::BadRequest => USAGE,
        ErrorKind::Unreachable => UNREACHABLE,
        ErrorKind::Other => ERROR,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_a_distinct_meaningful_code() {
        assert_eq!(for_kind(ErrorKind::NotFound), 3);
        assert_eq!(for_kind(ErrorKind::Unauthorized), 4);
        assert_eq!(for_kind(ErrorKind::Refused), 5);
        assert_eq!(for_kind(ErrorKind::Unreachable), 6);
        assert_eq!(for_kind(ErrorKind::BadRequest), 2);
        assert_eq!(for_kind(ErrorKind::Other), 1);
    }

    #[test]
    fn client_errors_map_through_their_kind() {
        let not_found = warren_client::ApiError::Status {
            status: 404,
            message: "no".into(),
        };
        assert_eq!(for_kind(not_found.kind()), NOT_FOUND);
        let quota = warren_client::ApiError::Status {
            status: 429,
            message: "quota".into(),
        };
        assert_eq!(for_kind(quota.kind()), REFUSED);
        let rpc = warren_client::EnvdError::Rpc {
            code: "unauthenticated".into(),
            message: "x".into(),
        };
        assert_eq!(for_kind(rpc.kind()), AUTH);
    }
}

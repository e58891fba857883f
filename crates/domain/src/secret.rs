//! Unguessable values (join tokens, gateway virtual keys, grading nonces, run ids) from the
//! operating system's random number generator. There is no fallback: a value made up from the
//! time or the pid could be guessed, so when the OS cannot give random bytes we say so and stop.

/// The OS's random number generator failed.
#[derive(Debug, thiserror::Error)]
#[error(
    "the operating system's random number generator failed ({0}); reprobench will not make up a guessable secret: check that getrandom(2) or /dev/urandom works in this container"
)]
pub struct RandomError(String);

/// `n` random bytes from the OS, hex-encoded (2n hex digits).
pub fn try_random_hex(n: usize) -> Result<String, RandomError> {
    hex_from(n, |buf| getrandom::fill(buf).map_err(|e| e.to_string()))
}

/// `n` random bytes from the OS, hex-encoded.
///
/// # Panics
/// When the OS's random number generator fails (see [`RandomError`]): callers that make
/// secrets have no safe way on.
pub fn random_hex(n: usize) -> String {
    try_random_hex(n).unwrap_or_else(|e| panic!("{e}"))
}

fn hex_from(
    n: usize,
    fill: impl FnOnce(&mut [u8]) -> Result<(), String>,
) -> Result<String, RandomError> {
    let mut buf = vec![0u8; n];
    fill(&mut buf).map_err(RandomError)?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

/// Whether two secrets are equal, in time that depends on their lengths only (not on where
/// they first differ).
pub fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_compare_equal_only_when_identical() {
        assert!(same_secret(b"abc", b"abc"));
        assert!(!same_secret(b"abc", b"abd"));
        assert!(!same_secret(b"abc", b"ab"));
        assert!(same_secret(b"", b""));
    }

    #[test]
    fn random_hex_is_fresh_and_of_the_asked_length() {
        let a = random_hex(16);
        let b = random_hex(16);
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    #[test]
    fn a_failing_rng_is_an_error_never_a_made_up_value() {
        let err = hex_from(16, |_| Err("ENOSYS".into())).unwrap_err();
        assert!(err.to_string().contains("ENOSYS"), "{err}");
    }
}

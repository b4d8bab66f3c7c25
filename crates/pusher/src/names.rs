//! Pusher channel names and kinds: what a name's prefix means (auth,
//! presence, cache, encryption) and which names are valid. The core never
//! parses names; the session and the HTTP API decide with these rules.

/// The hub namespace of Pusher channels: Pusher's queries, webhooks and
/// the dashboard's Pusher list see these channels and no other protocol's.
pub const NAMESPACE: herald_core::namespace::Namespace =
    herald_core::namespace::Namespace::new("pusher");

/// What a channel's name makes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelKind {
    /// Subscribing needs a signature from the app (private, encrypted, presence).
    pub needs_auth: bool,
    pub presence: bool,
    /// `private-encrypted-`: the server relays ciphertext and forbids client events.
    pub encrypted: bool,
    /// `cache-`, `private-cache-`, `presence-cache-`: replay the last event.
    pub cache: bool,
    /// `#server-to-user-{id}`: reaches a signed-in user; not subscribable.
    pub user: bool,
}

pub const SERVER_TO_USER_PREFIX: &str = "#server-to-user-";

impl ChannelKind {
    pub fn of(name: &str) -> ChannelKind {
        let presence = name.starts_with("presence-");
        let private = name.starts_with("private-");
        ChannelKind {
            needs_auth: presence || private,
            presence,
            encrypted: name.starts_with("private-encrypted-"),
            cache: name.starts_with("cache-")
                || name.starts_with("private-cache-")
                || name.starts_with("presence-cache-")
                || name.starts_with("private-encrypted-cache-"),
            user: name.starts_with(SERVER_TO_USER_PREFIX),
        }
    }

    /// Client events are allowed on private and presence channels, never on
    /// encrypted ones (the server could not know what it relays).
    pub fn allows_client_events(&self) -> bool {
        self.needs_auth && !self.encrypted
    }
}

/// Why a channel name is refused.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum NameError {
    #[error("channel name must not be empty")]
    Empty,
    #[error("channel name is longer than {0} characters")]
    TooLong(usize),
    #[error("channel name may only contain A-Z a-z 0-9 _ - = @ , . ;")]
    BadCharacter,
}

/// Validate a name a client may subscribe to: Pusher's character set and
/// length limit.
pub fn validate_name(name: &str, max_len: usize) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty);
    }
    if name.len() > max_len {
        return Err(NameError::TooLong(max_len));
    }
    if !name.bytes().all(is_name_byte) {
        return Err(NameError::BadCharacter);
    }
    Ok(())
}

/// Validate a channel an app publishes to through the HTTP API: the same
/// rules, plus `#server-to-user-{id}` (user ids may hold any printable
/// character but not spaces).
pub fn validate_publish_name(name: &str, max_len: usize) -> Result<(), NameError> {
    if let Some(user) = name.strip_prefix(SERVER_TO_USER_PREFIX) {
        if user.is_empty() {
            return Err(NameError::Empty);
        }
        // In characters, like user ids themselves: a user id within its
        // limit must not be refused for being non-ASCII.
        if name.chars().count() > max_len {
            return Err(NameError::TooLong(max_len));
        }
        if user.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return Err(NameError::BadCharacter);
        }
        return Ok(());
    }
    validate_name(name, max_len)
}

fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'=' | b'@' | b',' | b'.' | b';')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_follow_prefixes() {
        assert!(!ChannelKind::of("news").needs_auth);
        assert!(ChannelKind::of("private-a").allows_client_events());
        assert!(!ChannelKind::of("private-encrypted-a").allows_client_events());
        assert!(ChannelKind::of("presence-cache-a").presence);
        assert!(ChannelKind::of("presence-cache-a").cache);
        assert!(ChannelKind::of("cache-a").cache);
        assert!(!ChannelKind::of("cache-a").needs_auth);
        assert!(!ChannelKind::of("news").allows_client_events());
        assert!(ChannelKind::of("#server-to-user-1").user);
    }

    #[test]
    fn names_are_validated() {
        assert_eq!(validate_name("a-b_c=d@e,f.g;h", 164), Ok(()));
        assert_eq!(validate_name("", 164), Err(NameError::Empty));
        assert_eq!(
            validate_name(&"a".repeat(165), 164),
            Err(NameError::TooLong(164))
        );
        assert_eq!(validate_name("a b", 164), Err(NameError::BadCharacter));
        assert_eq!(
            validate_name("#server-to-user-1", 164),
            Err(NameError::BadCharacter)
        );
        assert_eq!(validate_publish_name("#server-to-user-1", 164), Ok(()));
        assert_eq!(
            validate_publish_name("#server-to-user-", 164),
            Err(NameError::Empty)
        );
        // 148 two-byte characters: 164 characters in all, 312 bytes.
        let fits = format!("#server-to-user-{}", "é".repeat(164 - 16));
        assert_eq!(validate_publish_name(&fits, 164), Ok(()));
        assert_eq!(
            validate_publish_name(&format!("{fits}é"), 164),
            Err(NameError::TooLong(164))
        );
    }
}

//! Presence members: parsing and checking the `channel_data` an app signs
//! for a presence subscription, and encoding the member list.
//!
//! User ids may be JSON strings or numbers (Laravel signs integers). A
//! number is kept as the text the app wrote, never through `f64`: two ids
//! above 2^53 that differ in their last digits must stay two users.

use serde::Deserialize;
use serde_json::value::RawValue;

/// A member as the app described it in `channel_data`.
#[derive(Debug)]
pub struct MemberData {
    pub user_id: String,
    pub user_info: Option<Box<RawValue>>,
}

#[derive(Deserialize)]
struct ChannelData {
    user_id: Box<RawValue>,
    user_info: Option<Box<RawValue>>,
}

/// A user id given as JSON: a string's contents, or a number's exact
/// text; `None` for anything else.
pub fn id_text(raw: &RawValue) -> Option<String> {
    let text = raw.get();
    match text.as_bytes().first()? {
        b'"' => serde_json::from_str(text).ok(),
        // A RawValue is valid JSON: this is a whole number token.
        b'-' | b'0'..=b'9' => Some(text.to_owned()),
        _ => None,
    }
}

/// Limits for one member, from the app's configuration.
pub struct MemberLimits {
    pub max_user_id: usize,
    pub max_user_info: usize,
}

/// Parse and check `channel_data`. User ids may be strings or numbers (Laravel
/// signs integer ids); they are handled as strings from here on.
pub fn parse_channel_data(text: &str, limits: &MemberLimits) -> Result<MemberData, String> {
    // serde would read a struct from an array too (`[1,2]` as user 1).
    if !text.trim_start().starts_with('{') {
        return Err("invalid channel_data: must be a JSON object".into());
    }
    let data: ChannelData =
        serde_json::from_str(text).map_err(|e| format!("invalid channel_data: {e}"))?;
    let Some(user_id) = id_text(&data.user_id) else {
        return Err("channel_data.user_id must be a string or a number".into());
    };
    if user_id.is_empty() {
        return Err("channel_data.user_id must not be empty".into());
    }
    // Pusher counts characters, not bytes.
    if user_id.chars().count() > limits.max_user_id {
        return Err(format!(
            "channel_data.user_id is longer than {} characters",
            limits.max_user_id
        ));
    }
    if let Some(info) = &data.user_info {
        if info.get().len() > limits.max_user_info {
            return Err(format!(
                "channel_data.user_info is larger than {} bytes",
                limits.max_user_info
            ));
        }
    }
    Ok(MemberData {
        user_id,
        user_info: data.user_info,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    const L: MemberLimits = MemberLimits {
        max_user_id: 128,
        max_user_info: 1024,
    };

    #[test]
    fn accepts_string_and_number_ids() {
        let m = parse_channel_data(r#"{"user_id":"u1","user_info":{"name":"A"}}"#, &L).unwrap();
        assert_eq!(m.user_id, "u1");
        assert_eq!(m.user_info.unwrap().get(), r#"{"name":"A"}"#);
        assert_eq!(
            parse_channel_data(r#"{"user_id":42}"#, &L).unwrap().user_id,
            "42"
        );
    }

    #[test]
    fn integer_ids_keep_every_digit() {
        for id in ["1180591620717411303424", "9007199254740993", "-12", "0"] {
            let text = format!(r#"{{"user_id":{id}}}"#);
            assert_eq!(parse_channel_data(&text, &L).unwrap().user_id, id);
        }
        let a = parse_channel_data(r#"{"user_id":9007199254740992}"#, &L).unwrap();
        let b = parse_channel_data(r#"{"user_id":9007199254740993}"#, &L).unwrap();
        assert_ne!(a.user_id, b.user_id);
        let s = parse_channel_data(r#"{"user_id":"a\"b"}"#, &L).unwrap();
        assert_eq!(s.user_id, "a\"b");
    }

    #[test]
    fn only_an_object_is_channel_data() {
        for text in ["[1,2]", r#"["u1",{"a":1}]"#, "1", r#""u1""#, "null", " [1]"] {
            let e = parse_channel_data(text, &L).unwrap_err();
            assert!(e.contains("JSON object"), "{text}: {e}");
        }
        for text in [
            r#"{"user_id":null}"#,
            r#"{"user_id":true}"#,
            r#"{"user_id":{"a":1}}"#,
        ] {
            assert!(parse_channel_data(text, &L).is_err(), "{text}");
        }
    }

    #[test]
    fn enforces_limits_and_shape() {
        assert!(parse_channel_data("{}", &L).is_err());
        assert!(parse_channel_data(r#"{"user_id":""}"#, &L).is_err());
        assert!(parse_channel_data(r#"{"user_id":[1]}"#, &L).is_err());
        let long = format!(r#"{{"user_id":"{}"}}"#, "x".repeat(129));
        assert!(parse_channel_data(&long, &L).unwrap_err().contains("128"));
        let big = format!(r#"{{"user_id":"a","user_info":"{}"}}"#, "x".repeat(1100));
        assert!(parse_channel_data(&big, &L).unwrap_err().contains("1024"));
    }
}

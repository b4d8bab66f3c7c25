//! Presence members: parsing and checking the `channel_data` an app signs
//! for a presence subscription, and encoding the member list.

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

/// A member as the app described it in `channel_data`.
#[derive(Debug)]
pub struct MemberData {
    pub user_id: String,
    pub user_info: Option<Box<RawValue>>,
}

#[derive(Deserialize)]
struct ChannelData {
    user_id: Value,
    user_info: Option<Box<RawValue>>,
}

/// Limits for one member, from the app's configuration.
pub struct MemberLimits {
    pub max_user_id: usize,
    pub max_user_info: usize,
}

/// Parse and check `channel_data`. User ids may be strings or numbers (Laravel
/// signs integer ids); they are handled as strings from here on.
pub fn parse_channel_data(text: &str, limits: &MemberLimits) -> Result<MemberData, String> {
    let data: ChannelData =
        serde_json::from_str(text).map_err(|e| format!("invalid channel_data: {e}"))?;
    let user_id = match data.user_id {
        Value::String(s) => s,
        Value::Number(n) => n.to_string(),
        _ => return Err("channel_data.user_id must be a string or a number".into()),
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

//! AppSync's `AWS_IAM` mode: AWS Signature Version 4 (`AWS4-HMAC-SHA256`)
//! on the connection's header, on each subscribe and publish message, and
//! on HTTP publishes, checked against access keys Herald is given (there is
//! no AWS account behind it: a key either is configured or is refused).
//!
//! The service must be `appsync`; the region the one in the host for
//! AppSync's own domains (`{id}.appsync-api.{region}.amazonaws.com`), else
//! one of the provider's `regions` (any when none are listed); `x-amz-date`
//! must be signed and within `max_skew` seconds of now. What is signed is
//! the HTTP request for HTTP publishes, and for WebSocket messages the
//! request Amplify signs: `POST` to the API's HTTP path with the message's
//! JSON body (`{}` for the connection).

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

type HmacSha256 = Hmac<Sha256>;

/// The scheme of a SigV4 `Authorization` value.
pub const SCHEME: &str = "AWS4-HMAC-SHA256";

/// A request as SigV4 signs it.
pub struct Signed<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub query: &'a str,
    /// Headers, names lowercase.
    pub headers: Vec<(String, String)>,
    pub body: &'a [u8],
}

impl Signed<'_> {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A configured access key.
#[derive(Debug, Clone)]
pub struct AccessKey {
    pub id: String,
    pub secret: String,
}

#[derive(Debug, Clone)]
pub struct Iam {
    pub keys: Vec<AccessKey>,
    pub regions: Vec<String>,
    pub max_skew: u64,
}

fn mac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut m = HmacSha256::new_from_slice(key).expect("HMAC takes any key length");
    m.update(data);
    m.finalize().into_bytes().to_vec()
}

fn sha_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

/// RFC 3986 encoding as SigV4's canonical URI has it (JavaScript's
/// `encodeURIComponent`, `/` kept).
fn uri_encode(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for b in path.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.!~*'()/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The canonical query string: pairs sorted, each part encoded.
fn canonical_query(query: &str) -> String {
    let mut pairs: Vec<(String, String)> = form_pairs(query);
    pairs.sort();
    pairs
        .iter()
        .map(|(k, v)| {
            format!(
                "{}={}",
                uri_encode(k).replace('/', "%2F"),
                uri_encode(v).replace('/', "%2F")
            )
        })
        .collect::<Vec<_>>()
        .join("&")
}

fn form_pairs(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (k.to_owned(), v.to_owned())
        })
        .collect()
}

/// Seconds since the epoch of an `x-amz-date` (`YYYYMMDDTHHMMSSZ`).
fn amz_time(v: &str) -> Option<i64> {
    let b = v.as_bytes();
    if b.len() != 16 || b[8] != b'T' || b[15] != b'Z' {
        return None;
    }
    let n = |r: std::ops::Range<usize>| -> Option<i64> { v.get(r)?.parse().ok() };
    let (y, mo, d) = (n(0..4)?, n(4..6)?, n(6..8)?);
    let (h, mi, s) = (n(9..11)?, n(11..13)?, n(13..15)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || s > 60 {
        return None;
    }
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if mo <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + h * 3600 + mi * 60 + s)
}

/// The region in an AppSync domain (`….appsync-api.REGION.amazonaws.com`,
/// `….appsync-realtime-api.REGION.amazonaws.com`), if the host is one.
pub fn region_of_host(host: &str) -> Option<&str> {
    let host = host.split(':').next()?;
    let mut it = host.split('.');
    let _id = it.next()?;
    let api = it.next()?;
    let region = it.next()?;
    (matches!(api, "appsync-api" | "appsync-realtime-api") && host.ends_with(".amazonaws.com"))
        .then_some(region)
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

impl Iam {
    /// Verify the request's signature; `Ok` with the access key id.
    pub fn verify(&self, req: &Signed<'_>) -> Result<String, String> {
        let auth = req.header("authorization").ok_or("Missing Authorization")?;
        let rest = auth
            .strip_prefix(SCHEME)
            .ok_or("Authorization is not AWS4-HMAC-SHA256")?;
        let (mut credential, mut signed_headers, mut signature) = (None, None, None);
        for part in rest.split(',') {
            let part = part.trim();
            if let Some(v) = part.strip_prefix("Credential=") {
                credential = Some(v);
            } else if let Some(v) = part.strip_prefix("SignedHeaders=") {
                signed_headers = Some(v);
            } else if let Some(v) = part.strip_prefix("Signature=") {
                signature = Some(v);
            }
        }
        let (Some(credential), Some(signed_headers), Some(signature)) =
            (credential, signed_headers, signature)
        else {
            return Err("Authorization lacks Credential, SignedHeaders or Signature".into());
        };
        let mut c = credential.split('/');
        let (Some(id), Some(date), Some(region), Some(service), Some("aws4_request"), None) =
            (c.next(), c.next(), c.next(), c.next(), c.next(), c.next())
        else {
            return Err("Credential is not KEY/DATE/REGION/SERVICE/aws4_request".into());
        };
        if service != "appsync" {
            return Err(format!(
                "Credential should be scoped to correct service: 'appsync', not {service:?}"
            ));
        }
        let host = req.header("host").unwrap_or("");
        match region_of_host(host) {
            Some(r) if r != region => {
                return Err(format!(
                    "Credential should be scoped to a valid region: '{r}'"
                ))
            }
            None if !self.regions.is_empty() && !self.regions.iter().any(|r| r == region) => {
                return Err(format!("Credential region {region:?} is not accepted"))
            }
            _ => {}
        }
        let names: Vec<&str> = signed_headers.split(';').collect();
        if !names.contains(&"host") || !names.contains(&"x-amz-date") {
            return Err("SignedHeaders must include host and x-amz-date".into());
        }
        let amz_date = req.header("x-amz-date").ok_or("Missing x-amz-date")?;
        let at = amz_time(amz_date).ok_or("x-amz-date is not YYYYMMDDTHHMMSSZ")?;
        if (now() - at).unsigned_abs() > self.max_skew {
            return Err("Signature expired: x-amz-date is outside the allowed window".into());
        }
        if !amz_date.starts_with(date) || date.len() != 8 {
            return Err("Credential date does not match x-amz-date".into());
        }
        let key = self
            .keys
            .iter()
            .find(|k| k.id == id)
            .ok_or("The security token included in the request is invalid.")?;
        let mut canonical_headers = String::new();
        for name in &names {
            let v = req
                .header(name)
                .ok_or_else(|| format!("Signed header {name:?} is missing"))?;
            let v = v.split_whitespace().collect::<Vec<_>>().join(" ");
            canonical_headers.push_str(&format!("{name}:{v}\n"));
        }
        let path = if req.path.is_empty() { "/" } else { req.path };
        let canonical = format!(
            "{}\n{}\n{}\n{}\n{}\n{}",
            req.method,
            uri_encode(path),
            canonical_query(req.query),
            canonical_headers,
            signed_headers,
            sha_hex(req.body)
        );
        let scope = format!("{date}/{region}/{service}/aws4_request");
        let to_sign = format!(
            "{SCHEME}\n{amz_date}\n{scope}\n{}",
            sha_hex(canonical.as_bytes())
        );
        let k = mac(format!("AWS4{}", key.secret).as_bytes(), date.as_bytes());
        let k = mac(&k, region.as_bytes());
        let k = mac(&k, service.as_bytes());
        let k = mac(&k, b"aws4_request");
        let want = hex::encode(mac(&k, to_sign.as_bytes()));
        if bool::from(want.as_bytes().ct_eq(signature.as_bytes())) {
            Ok(id.to_owned())
        } else {
            Err(
                "The request signature we calculated does not match the signature you provided."
                    .into(),
            )
        }
    }
}

/// Sign a request (tests and tools): the `Authorization` value.
pub fn sign(key: &AccessKey, region: &str, req: &Signed<'_>, names: &[&str]) -> String {
    let amz_date = req.header("x-amz-date").unwrap_or_default();
    let date = amz_date.get(..8).unwrap_or_default();
    let mut names: Vec<&str> = names.to_vec();
    names.sort_unstable();
    let mut canonical_headers = String::new();
    for name in &names {
        canonical_headers.push_str(&format!(
            "{name}:{}\n",
            req.header(name).unwrap_or_default().trim()
        ));
    }
    let signed_headers = names.join(";");
    let canonical = format!(
        "{}\n{}\n{}\n{}\n{}\n{}",
        req.method,
        uri_encode(req.path),
        canonical_query(req.query),
        canonical_headers,
        signed_headers,
        sha_hex(req.body)
    );
    let scope = format!("{date}/{region}/appsync/aws4_request");
    let to_sign = format!(
        "{SCHEME}\n{amz_date}\n{scope}\n{}",
        sha_hex(canonical.as_bytes())
    );
    let k = mac(format!("AWS4{}", key.secret).as_bytes(), date.as_bytes());
    let k = mac(&k, region.as_bytes());
    let k = mac(&k, b"appsync");
    let k = mac(&k, b"aws4_request");
    format!(
        "{SCHEME} Credential={}/{scope}, SignedHeaders={signed_headers}, Signature={}",
        key.id,
        hex::encode(mac(&k, to_sign.as_bytes()))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp(t: i64) -> String {
        // Inverse of amz_time for the test (civil from days).
        let days = t.div_euclid(86_400);
        let secs = t.rem_euclid(86_400);
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z - era * 146_097;
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let d = doy - (153 * mp + 2) / 5 + 1;
        let m = if mp < 10 { mp + 3 } else { mp - 9 };
        let y = yoe + era * 400 + i64::from(m <= 2);
        format!(
            "{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z",
            secs / 3600,
            secs % 3600 / 60,
            secs % 60
        )
    }

    #[test]
    fn dates() {
        assert_eq!(amz_time("19700101T000000Z"), Some(0));
        assert_eq!(amz_time("20240229T120000Z"), Some(1_709_208_000));
        assert_eq!(amz_time(&stamp(1_709_208_000)), Some(1_709_208_000));
        assert_eq!(amz_time("2024-02-29"), None);
        assert_eq!(
            region_of_host("abc.appsync-api.eu-west-1.amazonaws.com"),
            Some("eu-west-1")
        );
        assert_eq!(region_of_host("127.0.0.1:443"), None);
    }

    #[test]
    fn signatures_round_trip_and_tampering_fails() {
        let key = AccessKey {
            id: "AKIDEXAMPLE".into(),
            secret: "s3cr3t".into(),
        };
        let iam = Iam {
            keys: vec![key.clone()],
            regions: vec!["us-east-1".into()],
            max_skew: 300,
        };
        let date = stamp(now());
        let mut req = Signed {
            method: "POST",
            path: "/event",
            query: "",
            headers: vec![
                ("host".into(), "127.0.0.1:8443".into()),
                ("x-amz-date".into(), date.clone()),
                (
                    "content-type".into(),
                    "application/json; charset=UTF-8".into(),
                ),
            ],
            body: br#"{"channel":"/default/a"}"#,
        };
        let auth = sign(
            &key,
            "us-east-1",
            &req,
            &["host", "x-amz-date", "content-type"],
        );
        req.headers.push(("authorization".into(), auth.clone()));
        assert_eq!(iam.verify(&req).unwrap(), "AKIDEXAMPLE");
        // Another body, another region, another service, a stale date.
        let other = Signed {
            body: br#"{"channel":"/default/b"}"#,
            headers: req.headers.clone(),
            ..req
        };
        assert!(iam.verify(&other).unwrap_err().contains("does not match"));
        let bad_region = auth.replace("us-east-1", "eu-west-1");
        let mut r2 = Signed {
            headers: req.headers.clone(),
            ..other
        };
        r2.body = req.body;
        r2.headers.last_mut().unwrap().1 = bad_region;
        assert!(iam.verify(&r2).unwrap_err().contains("region"));
        r2.headers.last_mut().unwrap().1 = auth.replace("/appsync/", "/execute-api/");
        assert!(iam.verify(&r2).unwrap_err().contains("service"));
        r2.headers.last_mut().unwrap().1 = auth.replace("AKIDEXAMPLE", "AKIDOTHER");
        assert!(iam.verify(&r2).is_err());
        r2.headers.last_mut().unwrap().1 = auth.clone();
        r2.headers[1].1 = stamp(now() - 3600);
        assert!(iam.verify(&r2).unwrap_err().contains("expired"));
    }
}

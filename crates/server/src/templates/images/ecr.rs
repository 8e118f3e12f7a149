//! Amazon ECR logins for `from_aws_registry(image, access_key_id, secret_access_key, region)`: ECR's
//! registries take the user `AWS` and a password that only ECR's `GetAuthorizationToken` call hands
//! out, so the build makes that call, signed with AWS Signature Version 4, and logs in with what
//! comes back. The keys live only in memory for the build, as every registry login does.

use std::fmt;
use std::time::Duration;

use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use super::registry::RegistryCredentials;

/// What `from_aws_registry` gives.
#[derive(Clone, PartialEq, Eq)]
pub struct AwsKeys {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub region: String,
}

// The secret never appears in logs or panics.
impl fmt::Debug for AwsKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AwsKeys")
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"[redacted]")
            .field("region", &self.region)
            .finish()
    }
}

const TARGET: &str = "AmazonEC2ContainerRegistry_V20150921.GetAuthorizationToken";
const CONTENT_TYPE: &str = "application/x-amz-json-1.1";

/// ECR's API endpoint for `region` (`WARREN_ECR_ENDPOINT` replaces it, e.g. for a VPC endpoint).
fn endpoint(region: &str) -> String {
    std::env::var("WARREN_ECR_ENDPOINT")
        .ok()
        .filter(|e| !e.trim().is_empty())
        .unwrap_or_else(|| format!("https://api.ecr.{region}.amazonaws.com/"))
}

/// Asks ECR for a registry login with `keys`.
pub fn login(keys: &AwsKeys) -> Result<RegistryCredentials, String> {
    let valid_region = !keys.region.is_empty()
        && keys
            .region
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !valid_region || keys.access_key_id.is_empty() || keys.secret_access_key.is_empty() {
        return Err(
            "type aws needs awsAccessKeyId, awsSecretAccessKey and awsRegion (e.g. us-east-1)"
                .into(),
        );
    }
    let url = endpoint(&keys.region);
    let host = url
        .split("://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap_or_default()
        .to_string();
    let body = "{}";
    let now = chrono::Utc::now();
    let amz_date = now.format("%Y%m%dT%H%M%SZ").to_string();
    let authorization = authorization(keys, &host, &amz_date, body);
    let response = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(30))
        .build()
        .post(&url)
        .set("Content-Type", CONTENT_TYPE)
        .set("X-Amz-Target", TARGET)
        .set("X-Amz-Date", &amz_date)
        .set("Authorization", &authorization)
        .send_string(body);
    let text = match response {
        Ok(response) => response
            .into_string()
            .map_err(|e| format!("ECR's answer: {e}"))?,
        Err(ureq::Error::Status(status, response)) => {
            let text = response.into_string().unwrap_or_default();
            return Err(format!(
                "ECR refused GetAuthorizationToken ({status}): {}",
                text.chars().take(300).collect::<String>()
            ));
        }
        Err(e) => return Err(format!("ECR at {url}: {e}")),
    };
    let answer: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("ECR's answer is not JSON: {e}"))?;
    let token = answer["authorizationData"][0]["authorizationToken"]
        .as_str()
        .ok_or("ECR's answer has no authorizationToken")?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(token)
        .map_err(|e| format!("ECR's token is not base64: {e}"))?;
    let decoded = String::from_utf8(decoded).map_err(|_| "ECR's token is not text")?;
    let (user, password) = decoded
        .split_once(':')
        .ok_or("ECR's token is not user:password")?;
    Ok(RegistryCredentials::new(user, password))
}

/// The `Authorization` header of a SigV4-signed `POST /` to ECR with `body`.
fn authorization(keys: &AwsKeys, host: &str, amz_date: &str, body: &str) -> String {
    let signed_headers = "content-type;host;x-amz-date;x-amz-target";
    let canonical = format!(
        "POST\n/\n\ncontent-type:{CONTENT_TYPE}\nhost:{host}\nx-amz-date:{amz_date}\nx-amz-target:{TARGET}\n\n{signed_headers}\n{}",
        hex::encode(Sha256::digest(body.as_bytes()))
    );
    let date = &amz_date[..8];
    let scope = format!("{date}/{}/ecr/aws4_request", keys.region);
    let signature = sign(
        &keys.secret_access_key,
        date,
        &keys.region,
        "ecr",
        &string_to_sign(amz_date, &scope, &canonical),
    );
    format!(
        "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed_headers}, Signature={signature}",
        keys.access_key_id
    )
}

fn string_to_sign(amz_date: &str, scope: &str, canonical_request: &str) -> String {
    format!(
        "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
        hex::encode(Sha256::digest(canonical_request.as_bytes()))
    )
}

fn hmac(key: &[u8], data: &str) -> Vec<u8> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes keys of any length");
    mac.update(data.as_bytes());
    mac.finalize().into_bytes().to_vec()
}

fn signing_key(secret: &str, date: &str, region: &str, service: &str) -> Vec<u8> {
    let k_date = hmac(format!("AWS4{secret}").as_bytes(), date);
    let k_region = hmac(&k_date, region);
    let k_service = hmac(&k_region, service);
    hmac(&k_service, "aws4_request")
}

/// The hex signature of `string_to_sign`.
fn sign(secret: &str, date: &str, region: &str, service: &str, string_to_sign: &str) -> String {
    hex::encode(hmac(
        &signing_key(secret, date, region, service),
        string_to_sign,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// AWS's own worked example (IAM ListUsers, 2015-08-30) from the SigV4 documentation.
    #[test]
    fn the_signature_matches_aws_s_worked_example() {
        let secret = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";
        assert_eq!(
            hex::encode(signing_key(secret, "20150830", "us-east-1", "iam")),
            "c4afb1cc5771d871763a393e44b703571b55cc28424d1a5e86da6ed3c154a4b9"
        );
        let canonical = "GET\n/\nAction=ListUsers&Version=2010-05-08\n\
            content-type:application/x-www-form-urlencoded; charset=utf-8\nhost:iam.amazonaws.com\n\
            x-amz-date:20150830T123600Z\n\ncontent-type;host;x-amz-date\n\
            e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        let to_sign = string_to_sign(
            "20150830T123600Z",
            "20150830/us-east-1/iam/aws4_request",
            canonical,
        );
        assert!(
            to_sign.ends_with("f536975d06c0309214f805bb90ccff089219ecd68b2577efef23edd43b7e1a59")
        );
        assert_eq!(
            sign(secret, "20150830", "us-east-1", "iam", &to_sign),
            "5d672d79c15b13162d9279b0855cfba6789a8edb4c82c400e06b5924a6f2b5d7"
        );
    }

    #[test]
    fn the_ecr_request_is_signed_for_its_region_and_the_secret_never_prints() {
        let keys = AwsKeys {
            access_key_id: "AKIDEXAMPLE".into(),
            secret_access_key: "secret-never-printed".into(),
            region: "eu-west-1".into(),
        };
        let header = authorization(
            &keys,
            "api.ecr.eu-west-1.amazonaws.com",
            "20261204T100000Z",
            "{}",
        );
        assert!(header.starts_with(
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261204/eu-west-1/ecr/aws4_request, \
             SignedHeaders=content-type;host;x-amz-date;x-amz-target, Signature="
        ));
        assert_eq!(header.rsplit('=').next().unwrap().len(), 64);
        assert!(!format!("{keys:?}").contains("secret-never-printed"));
        let bad = AwsKeys {
            region: "../x".into(),
            ..keys
        };
        assert!(login(&bad).unwrap_err().contains("awsRegion"));
    }

    #[test]
    fn a_login_asks_ecr_and_uses_the_user_and_password_it_hands_out() {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let mut request = Vec::new();
            let mut chunk = [0u8; 4096];
            while !String::from_utf8_lossy(&request).ends_with("{}") {
                let n = stream.read(&mut chunk).unwrap();
                if n == 0 {
                    break;
                }
                request.extend_from_slice(&chunk[..n]);
            }
            let token = base64::engine::general_purpose::STANDARD.encode("AWS:ecr-pass");
            let body = format!(r#"{{"authorizationData":[{{"authorizationToken":"{token}"}}]}}"#);
            write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )
            .unwrap();
            String::from_utf8_lossy(&request).to_ascii_lowercase()
        });
        std::env::set_var("WARREN_ECR_ENDPOINT", format!("http://{addr}/"));
        let keys = AwsKeys {
            access_key_id: "AKIDEXAMPLE".into(),
            secret_access_key: "s".into(),
            region: "us-east-1".into(),
        };
        let result = login(&keys);
        std::env::remove_var("WARREN_ECR_ENDPOINT");
        assert_eq!(result.unwrap(), RegistryCredentials::new("AWS", "ecr-pass"));
        let request = server.join().unwrap();
        assert!(request.starts_with("post / http/1.1"), "{request}");
        assert!(request.contains(&format!("x-amz-target: {}", TARGET.to_ascii_lowercase())));
        assert!(request.contains("authorization: aws4-hmac-sha256 credential=akidexample/"));
    }
}

//! What an OpenStack answer that is not a success means for the resource, in words an operator
//! can act on. Pure: a status and a body in, a [`SubstrateError`] out.
//!
//! - connection refused, timeouts, 5xx and 429: `Unreachable` (the phase stays, the next pass
//!   asks again);
//! - 403 "Quota exceeded": `Failed`, free or raise the quota;
//! - 400/404 naming an image, flavor or network, "Flavor's disk is too small": `Failed`, fix
//!   the blueprint parameters;
//! - any other 4xx: `Failed` with the service's own message.
//!
//! Every line names the cloud (its `auth_url`) and says what to do.

use crate::broker::substrate::SubstrateError;

/// The longest service message quoted in an error line.
pub(crate) const MAX_MESSAGE_CHARS: usize = 400;

/// The message of an OpenStack error body: Nova's `{"badRequest": {"message": ...}}`,
/// Keystone's and Neutron's `{"error"|"NeutronError": {"message": ...}}`, or the text of
/// Glance's HTML page; cut to [`MAX_MESSAGE_CHARS`].
pub(crate) fn service_message(body: &[u8]) -> String {
    let text = match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(serde_json::Value::Object(map)) => map
            .values()
            .find_map(|v| v.get("message").and_then(|m| m.as_str()).map(str::to_owned))
            .or_else(|| {
                map.get("message")
                    .and_then(|m| m.as_str())
                    .map(str::to_owned)
            })
            .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned()),
        _ => strip_html(&String::from_utf8_lossy(body)),
    };
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if text.chars().count() > MAX_MESSAGE_CHARS {
        let cut: String = text.chars().take(MAX_MESSAGE_CHARS).collect();
        format!("{cut}…")
    } else {
        text
    }
}

/// The text of an HTML error page without its tags and its `<title>` (which repeats the
/// status), entities left as they are.
fn strip_html(html: &str) -> String {
    let body = match (html.find("</title>"), html.find("<body")) {
        (_, Some(at)) => &html[at..],
        (Some(at), None) => &html[at + "</title>".len()..],
        _ => html,
    };
    let mut out = String::with_capacity(body.len());
    let mut in_tag = false;
    for c in body.chars() {
        match c {
            '<' => {
                in_tag = true;
                out.push(' ');
            }
            '>' => in_tag = false,
            c if !in_tag => out.push(c),
            _ => {}
        }
    }
    out
}

/// `service` answered `status` with `body` to `what` (e.g. "creating the server pr-…"):
/// what it means for the resource. A 401 is handled before (a fresh token, then
/// [`refused_token`]).
pub(crate) fn from_status(
    cloud: &str,
    service: &str,
    what: &str,
    status: u16,
    body: &[u8],
) -> SubstrateError {
    let message = service_message(body);
    if status == 429 || status >= 500 {
        return SubstrateError::Unreachable(format!(
            "{service} of the cloud {cloud} answered {status} to {what} ({message}); the broker asks again on its next pass"
        ));
    }
    let lower = message.to_ascii_lowercase();
    let advice = if lower.contains("quota exceeded") {
        "the project's quota is used up: delete servers it no longer needs or ask the cloud's operator to raise the quota, then create the resource again"
    } else if lower.contains("flavor's disk")
        || lower.contains("flavor's memory")
        || lower.contains("too small")
    {
        "the flavor is too small for the image: pick a larger flavor (flavorName) or a smaller image (imageName) and create the resource again"
    } else if lower.contains("image") && (lower.contains("not") || status == 404) {
        "check imageName (`openstack image list` shows what the credential's project sees) and create the resource again"
    } else if lower.contains("flavor") {
        "check flavorName (`openstack flavor list`) and create the resource again"
    } else if lower.contains("network") {
        "check networkName (`openstack network list`) and create the resource again"
    } else if lower.contains("key pair") || lower.contains("keypair") {
        "check keyName (`openstack keypair list` as the credential's user) and create the resource again"
    } else if lower.contains("availability zone") {
        "check availabilityZone (`openstack availability zone list`) and create the resource again"
    } else if status == 403 {
        "the credential's role does not allow it: give its user the member role in the project, or use another cloud credential"
    } else {
        "fix the resource's parameters or the cloud credential and create the resource again"
    };
    SubstrateError::Failed(format!(
        "{service} of the cloud {cloud} refused {what} ({status}: {message}); {advice}"
    ))
}

/// Keystone refused to sign in (401).
pub(crate) fn refused_credential(cloud: &str, who: &str, body: &[u8]) -> SubstrateError {
    SubstrateError::Failed(format!(
        "Keystone refused the cloud credential {who} (cloud {cloud}): {}; create a new application credential and rotate it with `plexctl cloud-credential rotate`",
        service_message(body)
    ))
}

/// A service answered 401 to a token Keystone had just issued.
pub(crate) fn refused_token(cloud: &str, service: &str, what: &str, body: &[u8]) -> SubstrateError {
    SubstrateError::Failed(format!(
        "{service} of the cloud {cloud} refused a fresh Keystone token for {what} (401: {}); check the cloud credential's roles and rotate it with `plexctl cloud-credential rotate`",
        service_message(body)
    ))
}

/// The request did not get an answer (refused, reset, timed out, a body too large).
pub(crate) fn transport(cloud: &str, service: &str, what: &str, reason: &str) -> SubstrateError {
    SubstrateError::Unreachable(format!(
        "cannot reach {service} of the cloud {cloud} for {what}: {reason}; the broker asks again on its next pass"
    ))
}

#[cfg(test)]
#[path = "error_tests.rs"]
mod tests;

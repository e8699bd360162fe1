//! Image, flavor and network "by name or id": Glance v2, Nova and Neutron v2.0 list what the
//! credential's project sees, and [`resolve`] picks: an exact id wins, else exactly one of
//! that name. None or several fail the resource with what there is.

use reqwest::Method;
use serde::Deserialize;

use super::error;
use super::session::{Service, Session};
use crate::broker::substrate::SubstrateError;

/// How many names or ids an error line lists at most.
pub(crate) const MAX_LISTED: usize = 10;
/// How many items one list call asks for (the services' own usual maximum): a project with
/// more images or flavors than this can still name any by id.
pub(crate) const LIST_LIMIT: usize = 1000;

/// One listed thing.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub(crate) struct Named {
    pub id: String,
    #[serde(default)]
    pub name: Option<String>,
}

/// The kinds looked up, as messages name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Image,
    Flavor,
    Network,
}

impl Kind {
    fn noun(self) -> &'static str {
        match self {
            Kind::Image => "image",
            Kind::Flavor => "flavor",
            Kind::Network => "network",
        }
    }

    fn parameter(self) -> &'static str {
        match self {
            Kind::Image => "imageName",
            Kind::Flavor => "flavorName",
            Kind::Network => "networkName",
        }
    }
}

/// `a, b, c …`: at most [`MAX_LISTED`] of them.
fn listing<'a>(items: impl Iterator<Item = &'a str>) -> String {
    let all: Vec<&str> = items.collect();
    let mut line = all
        .iter()
        .take(MAX_LISTED)
        .copied()
        .collect::<Vec<_>>()
        .join(", ");
    if all.len() > MAX_LISTED {
        line.push_str(" …");
    }
    if line.is_empty() {
        line.push_str("none");
    }
    line
}

/// The id of `wanted` among `items`: an exact id wins, else the one item of that name.
/// `Err`: the reason the resource fails (without the cloud, which the caller adds).
pub(crate) fn resolve(kind: Kind, wanted: &str, items: &[Named]) -> Result<String, String> {
    if let Some(item) = items.iter().find(|i| i.id == wanted) {
        return Ok(item.id.clone());
    }
    let named: Vec<&Named> = items
        .iter()
        .filter(|i| i.name.as_deref() == Some(wanted))
        .collect();
    let noun = kind.noun();
    match named.as_slice() {
        [one] => Ok(one.id.clone()),
        [] => Err(format!(
            "no {noun} named {wanted} in the cloud ({noun}s visible to the project: {}); set {} to one of them or to an id",
            listing(items.iter().map(|i| i.name.as_deref().unwrap_or(&i.id))),
            kind.parameter()
        )),
        several => Err(format!(
            "{} {noun}s are named {wanted} in the cloud (ids {}); set {} to one of these ids",
            several.len(),
            listing(several.iter().map(|i| i.id.as_str())),
            kind.parameter()
        )),
    }
}

/// Lists and resolves one parameter's value to an id.
pub(crate) async fn find(
    session: &Session,
    kind: Kind,
    wanted: &str,
) -> Result<String, SubstrateError> {
    let items = list(session, kind).await?;
    resolve(kind, wanted, &items)
        .map_err(|e| SubstrateError::Failed(format!("{e} (cloud {})", session.cloud())))
}

#[derive(Deserialize)]
struct Images {
    images: Vec<Named>,
}

#[derive(Deserialize)]
struct Flavors {
    flavors: Vec<Named>,
}

#[derive(Deserialize)]
struct Networks {
    networks: Vec<Named>,
}

async fn list(session: &Session, kind: Kind) -> Result<Vec<Named>, SubstrateError> {
    let (service, path) = match kind {
        Kind::Image => (Service::Image, format!("/v2/images?limit={LIST_LIMIT}")),
        Kind::Flavor => (Service::Compute, format!("/flavors?limit={LIST_LIMIT}")),
        Kind::Network => (
            Service::Network,
            "/v2.0/networks?fields=id&fields=name".to_owned(),
        ),
    };
    let what = format!("listing {}s", kind.noun());
    let reply = session
        .call(service, Method::GET, &path, None, &what)
        .await?;
    if reply.status != 200 {
        return Err(error::from_status(
            session.cloud(),
            service.label(),
            &what,
            reply.status,
            &reply.body,
        ));
    }
    let parsed = match kind {
        Kind::Image => serde_json::from_slice::<Images>(&reply.body).map(|l| l.images),
        Kind::Flavor => serde_json::from_slice::<Flavors>(&reply.body).map(|l| l.flavors),
        Kind::Network => serde_json::from_slice::<Networks>(&reply.body).map(|l| l.networks),
    };
    parsed.map_err(|e| {
        SubstrateError::Unreachable(format!(
            "{} of the cloud {} answered {what} with a body that does not parse ({e}); the broker asks again on its next pass",
            service.label(),
            session.cloud()
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(id: &str, name: &str) -> Named {
        Named {
            id: id.into(),
            name: Some(name.into()),
        }
    }

    #[test]
    fn an_id_wins_then_a_unique_name() {
        let items = [
            item("id-1", "debian"),
            item("id-2", "id-1"),
            item("id-3", "alpine"),
        ];
        assert_eq!(resolve(Kind::Image, "id-1", &items).unwrap(), "id-1");
        assert_eq!(resolve(Kind::Image, "alpine", &items).unwrap(), "id-3");
    }

    #[test]
    fn an_ambiguous_name_lists_the_candidates_ids() {
        let items = [
            item("a1", "m1.tiny"),
            item("b2", "m1.tiny"),
            item("c3", "m1.small"),
        ];
        let e = resolve(Kind::Flavor, "m1.tiny", &items).unwrap_err();
        assert_eq!(
            e,
            "2 flavors are named m1.tiny in the cloud (ids a1, b2); set flavorName to one of these ids"
        );
    }

    #[test]
    fn a_missing_name_lists_what_there_is_up_to_ten() {
        let items: Vec<Named> = (0..12)
            .map(|i| item(&format!("id{i}"), &format!("img{i}")))
            .collect();
        let e = resolve(Kind::Image, "ubuntu", &items).unwrap_err();
        assert_eq!(
            e,
            "no image named ubuntu in the cloud (images visible to the project: img0, img1, img2, img3, img4, img5, img6, img7, img8, img9 …); set imageName to one of them or to an id"
        );
        let e = resolve(Kind::Network, "net", &[]).unwrap_err();
        assert!(e.contains("networks visible to the project: none"), "{e}");
    }

    #[test]
    fn the_lab_listings_parse() {
        let images: Images =
            serde_json::from_str(include_str!("testdata/glance_images.json")).unwrap();
        assert_eq!(
            resolve(Kind::Image, "plexlab-tiny", &images.images).unwrap(),
            "00ba5bf2-2fa4-4d27-bcf4-6674854a5989"
        );
        let flavors: Flavors =
            serde_json::from_str(include_str!("testdata/nova_flavors.json")).unwrap();
        assert_eq!(
            resolve(Kind::Flavor, "m1.tiny", &flavors.flavors).unwrap(),
            "3632cdbe-4882-48d8-ac8c-eabe2c449d3f"
        );
        let networks: Networks =
            serde_json::from_str(include_str!("testdata/neutron_networks.json")).unwrap();
        assert_eq!(
            resolve(Kind::Network, "plexlab-net", &networks.networks).unwrap(),
            "514b3475-479b-4a08-87dd-722f5694e932"
        );
    }
}

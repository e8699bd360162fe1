//! Admitting a `resource create` request: the one check the server runs before it stores a
//! resource or touches a substrate. It fails closed on an unknown blueprint version, a `--kind`
//! that is not the blueprint's, and any parameter problem.

use serde_json::Value;
use uuid::Uuid;

use crate::blueprint::Blueprint;
use crate::catalog::Catalog;
use crate::params::{ParameterErrors, ResolvedParameters, resolve};

/// Why a request was not admitted. Every variant is the client's mistake (a 4xx).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdmitError {
    #[error(
        "no blueprint version {0} in this server's catalog; list the catalog for the version ids it offers"
    )]
    UnknownBlueprintVersion(Uuid),
    #[error(
        "blueprint {blueprint} makes resources of kind `{want}`, not `{got}`; pass --kind {want}"
    )]
    KindMismatch {
        blueprint: String,
        want: String,
        got: String,
    },
    #[error(transparent)]
    Parameters(#[from] ParameterErrors),
}

/// An admitted request: its blueprint and the resolved parameters.
#[derive(Debug, Clone)]
pub struct Admitted<'a> {
    pub blueprint: &'a Blueprint,
    pub parameters: ResolvedParameters,
}

/// Checks a request against the catalog.
pub fn admit<'a>(
    catalog: &'a Catalog,
    kind: &str,
    blueprint_version_id: Uuid,
    parameters: &Value,
) -> Result<Admitted<'a>, AdmitError> {
    let entry = catalog
        .get(&blueprint_version_id)
        .ok_or(AdmitError::UnknownBlueprintVersion(blueprint_version_id))?;
    let blueprint = &entry.blueprint;
    if blueprint.resource_kind != kind {
        return Err(AdmitError::KindMismatch {
            blueprint: blueprint.label(),
            want: blueprint.resource_kind.clone(),
            got: kind.to_owned(),
        });
    }
    let parameters = resolve(blueprint, parameters)?;
    Ok(Admitted {
        blueprint,
        parameters,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn admits_a_good_request_and_refuses_each_mistake() {
        let c = Catalog::builtin().unwrap();
        let bucket = c.find("local-bucket", "v1").unwrap().version_id;
        let ok = admit(&c, "bucket", bucket, &json!({"region": "us-east-1"})).unwrap();
        assert_eq!(ok.blueprint.name, "local-bucket");
        assert_eq!(ok.parameters["region"], "us-east-1");

        let unknown = Uuid::from_u128(1);
        assert_eq!(
            admit(&c, "bucket", unknown, &json!({})).unwrap_err(),
            AdmitError::UnknownBlueprintVersion(unknown)
        );
        let e = admit(&c, "node", bucket, &json!({"region": "us-east-1"})).unwrap_err();
        assert_eq!(
            e.to_string(),
            "blueprint local-bucket@v1 makes resources of kind `bucket`, not `node`; pass --kind bucket"
        );
        let e = admit(&c, "bucket", bucket, &json!({})).unwrap_err();
        assert_eq!(
            e.to_string(),
            "parameter `region` is required by local-bucket@v1 and missing"
        );
        assert!(
            matches!(e, AdmitError::Parameters(p) if p.errors[0].parameter() == Some("region"))
        );
    }
}

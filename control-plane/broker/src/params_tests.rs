use serde_json::json;

use super::*;
use crate::catalog::Catalog;

fn bp(name: &str) -> Blueprint {
    let c = Catalog::builtin().unwrap();
    c.entries()
        .into_iter()
        .find(|e| e.blueprint.name == name)
        .unwrap()
        .blueprint
        .clone()
}

fn errs(name: &str, given: serde_json::Value) -> Vec<ParameterError> {
    resolve(&bp(name), &given).unwrap_err().errors
}

/// A blueprint with an integer parameter (no built-in one declares one).
fn sized() -> Blueprint {
    Blueprint::parse(
        "sized.yaml",
        "name: sized\nversion: v1\nresource_kind: node\nclass: standalone\nsubstrate: crossplane\ncomposite: {api_version: a/v1, kind: K}\nparameters:\n  diskGiB: {type: integer, minimum: 1, maximum: 1024, default: 10}\n",
    )
    .unwrap()
}

fn sized_errs(given: serde_json::Value) -> Vec<ParameterError> {
    resolve(&sized(), &given).unwrap_err().errors
}

#[test]
fn defaults_are_applied_and_given_values_kept() {
    let r = resolve(&bp("local-machine"), &json!({"release": "bookworm"})).unwrap();
    assert_eq!(json!(r), json!({"arch": "amd64", "release": "bookworm"}));
    let r = resolve(
        &bp("local-machine"),
        &json!({"arch": "arm64", "release": "bookworm"}),
    )
    .unwrap();
    assert_eq!(json!(r), json!({"arch": "arm64", "release": "bookworm"}));
    let r = resolve(&sized(), &serde_json::Value::Null).unwrap();
    assert_eq!(json!(r), json!({"diskGiB": 10}));
    // An optional parameter without a default stays out.
    let r = resolve(
        &bp("openstack-instance"),
        &json!({"imageName": "Ubuntu 24.04 Noble Numbat x86_64", "flavorName": "1C-2GB-20GB", "networkName": "plexsphere-project-x"}),
    )
    .unwrap();
    assert!(!r.contains_key("availabilityZone"));
    assert_eq!(r["imageName"], "Ubuntu 24.04 Noble Numbat x86_64");
}

#[test]
fn a_missing_required_parameter_is_named() {
    let e = errs("local-bucket", json!({}));
    assert_eq!(
        e,
        [ParameterError::Missing {
            name: "region".into(),
            blueprint: "local-bucket@v1".into()
        }]
    );
    assert_eq!(e[0].parameter(), Some("region"));
    assert_eq!(
        e[0].to_string(),
        "parameter `region` is required by local-bucket@v1 and missing"
    );
}

#[test]
fn a_local_machine_needs_its_release_and_only_bookworm_is_built() {
    let e = errs("local-machine", json!({}));
    assert_eq!(
        e,
        [ParameterError::Missing {
            name: "release".into(),
            blueprint: "local-machine@v1".into()
        }]
    );
    assert_eq!(errs("local-machine", serde_json::Value::Null).len(), 1);
    let e = errs("local-machine", json!({"release": "trixie"}));
    assert_eq!(
        e[0].to_string(),
        "parameter `release` = \"trixie\" does not match the pattern `bookworm`"
    );
    // The memory limit it never applied is no longer accepted.
    let e = errs(
        "local-machine",
        json!({"release": "bookworm", "memoryMiB": 1024}),
    );
    assert_eq!(e[0].parameter(), Some("memoryMiB"));
    assert!(
        e[0].to_string()
            .contains("is not declared by local-machine@v1"),
        "{}",
        e[0]
    );
}

#[test]
fn an_unknown_parameter_is_named_with_what_is_accepted() {
    let e = errs(
        "local-bucket",
        json!({"region": "us-east-1", "regoin": "x"}),
    );
    assert_eq!(e.len(), 1);
    assert_eq!(
        e[0].to_string(),
        "parameter `regoin` is not declared by local-bucket@v1; it accepts region (required)"
    );
}

#[test]
fn a_wrong_type_names_the_expectation() {
    let e = sized_errs(json!({"diskGiB": "10"}));
    assert_eq!(
        e[0].to_string(),
        "parameter `diskGiB` must be an integer, not a string"
    );
    let e = sized_errs(json!({"diskGiB": 10.5}));
    assert_eq!(
        e[0].to_string(),
        "parameter `diskGiB` must be an integer, not a number with a fraction"
    );
    let e = errs("local-bucket", json!({"region": 1}));
    assert_eq!(
        e[0].to_string(),
        "parameter `region` must be a string, not an integer"
    );
}

#[test]
fn a_pattern_mismatch_names_the_pattern_and_matches_whole() {
    let e = errs(
        "local-machine",
        json!({"arch": "x86_64", "release": "bookworm"}),
    );
    assert_eq!(
        e[0].to_string(),
        "parameter `arch` = \"x86_64\" does not match the pattern `amd64|arm64`"
    );
    // Anchored: a value that merely contains a match is refused.
    let lm = |arch: &str| {
        errs(
            "local-machine",
            json!({"arch": arch, "release": "bookworm"}),
        )
    };
    assert_eq!(lm("xamd64").len(), 1);
    assert_eq!(lm("amd64\n").len(), 1);
    assert_eq!(
        errs("local-machine", json!({"release": "bookworm\n"})).len(),
        1
    );
    let e = errs(
        "openstack-instance",
        json!({"imageName": "a\nb", "flavorName": "f", "networkName": "n"}),
    );
    assert_eq!(e[0].parameter(), Some("imageName"));
}

#[test]
fn bounds_and_length_are_checked() {
    let e = sized_errs(json!({"diskGiB": 0}));
    assert_eq!(
        e[0].to_string(),
        "parameter `diskGiB` = 0 is outside 1..=1024"
    );
    assert_eq!(sized_errs(json!({"diskGiB": 1025})).len(), 1);
    let long = "a".repeat(MAX_STRING_BYTES + 1);
    let e = errs(
        "openstack-instance",
        json!({"imageName": long, "flavorName": "f", "networkName": "n"}),
    );
    assert_eq!(
        e[0],
        ParameterError::TooLong {
            name: "imageName".into()
        }
    );
}

#[test]
fn every_problem_is_reported_at_once_and_not_an_object_is_refused() {
    let e = errs("openstack-instance", json!({"image": "x", "flavorName": 2}));
    let names: Vec<_> = e.iter().filter_map(|e| e.parameter()).collect();
    assert_eq!(names, ["image", "flavorName", "imageName", "networkName"]);
    let all = resolve(&bp("openstack-instance"), &json!({"image": "x"})).unwrap_err();
    assert!(
        all.to_string()
            .contains("; parameter `imageName` is required"),
        "{all}"
    );
    let e = errs("local-bucket", json!(["us-east-1"]));
    assert_eq!(
        e[0].to_string(),
        "the parameters must be a JSON object such as {\"region\":\"us-east-1\"}, not an array"
    );
}

#[test]
fn blueprints_with_bad_declarations_are_refused_at_load() {
    let base = "name: b\nversion: v1\nresource_kind: node\nclass: standalone\nsubstrate: crossplane\ncomposite: {api_version: a/v1, kind: K}\nparameters:\n";
    let cases = [
        (
            "  p: {type: string, pattern: '('}\n",
            "not a valid regular expression",
        ),
        (
            "  p: {type: integer, pattern: 'a'}\n",
            "patterns apply to strings",
        ),
        (
            "  p: {type: string, default: 3}\n",
            "its default: parameter `p` must be a string",
        ),
        (
            "  p: {type: string, pattern: 'a+', default: b}\n",
            "does not match",
        ),
        (
            "  p: {type: string, required: true, default: a}\n",
            "required and has a default",
        ),
        (
            "  p: {type: boolean, minimum: 1}\n",
            "bounds apply to integers",
        ),
        (
            "  p: {type: integer, minimum: 2, maximum: 1}\n",
            "minimum 2 is above maximum 1",
        ),
        ("  9p: {type: string}\n", "must start with a letter"),
    ];
    for (decl, want) in cases {
        let text = format!("{base}{decl}");
        let e = Blueprint::parse("x.yaml", &text).unwrap_err().to_string();
        assert!(e.contains(want), "{decl}: {e}");
        assert!(e.starts_with("x.yaml:8:3: "), "{decl}: {e}");
    }
    let e = Blueprint::parse(
        "x.yaml",
        &format!("{base}  p: {{type: string, requird: true}}\n"),
    )
    .unwrap_err()
    .to_string();
    assert!(e.starts_with("x.yaml:8:") && e.contains("requird"), "{e}");
    let e = Blueprint::parse("x.yaml", &base.replace("name: b", "name: B"))
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("x.yaml:1:1: name `B`"), "{e}");
}

//! A server-certificate verifier with an optional SHA-256 pin of a private CA.
//!
//! When one certificate the server presents (it sends its leaf and its CA) has the pinned
//! SHA-256, the chain must verify with webpki against that certificate as the only root.
//! Otherwise the normal roots decide. A pin never weakens the check: the name, the validity
//! period and the signatures are verified either way.

use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::{CertificateError, DigitallySignedStruct, Error, RootCertStore, SignatureScheme};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

/// The SHA-256 of a certificate's DER, as a pin names it.
pub fn fingerprint(cert: &CertificateDer<'_>) -> [u8; 32] {
    plexsphere_wire::secret::sha256(cert.as_ref())
}

#[derive(Debug)]
pub struct PinnedVerifier {
    pin: Option<[u8; 32]>,
    /// The verifier over the system store and the CA files; `None` when there are no roots.
    normal: Option<Arc<WebPkiServerVerifier>>,
    provider: Arc<CryptoProvider>,
}

impl PinnedVerifier {
    pub fn new(
        pin: Option<[u8; 32]>,
        normal: Option<Arc<WebPkiServerVerifier>>,
        provider: Arc<CryptoProvider>,
    ) -> Self {
        Self {
            pin,
            normal,
            provider,
        }
    }

    /// The presented certificate that matches the pin, if any.
    fn pinned_cert<'a>(
        &self,
        end_entity: &'a CertificateDer<'a>,
        intermediates: &'a [CertificateDer<'a>],
    ) -> Option<&'a CertificateDer<'a>> {
        let pin = self.pin?;
        std::iter::once(end_entity)
            .chain(intermediates.iter())
            .find(|c| fingerprint(c) == pin)
    }
}

impl ServerCertVerifier for PinnedVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        if let Some(anchor) = self.pinned_cert(end_entity, intermediates) {
            let mut roots = RootCertStore::empty();
            roots
                .add(anchor.clone().into_owned())
                .map_err(|_| Error::InvalidCertificate(CertificateError::BadEncoding))?;
            let pinned =
                WebPkiServerVerifier::builder_with_provider(Arc::new(roots), self.provider.clone())
                    .build()
                    .map_err(|e| {
                        Error::General(format!("cannot build the pinned verifier: {e}"))
                    })?;
            let rest: Vec<CertificateDer<'_>> = intermediates
                .iter()
                .filter(|c| c.as_ref() != anchor.as_ref())
                .cloned()
                .collect();
            return pinned.verify_server_cert(end_entity, &rest, server_name, ocsp_response, now);
        }
        match &self.normal {
            Some(v) => {
                v.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
            }
            None => Err(Error::InvalidCertificate(CertificateError::UnknownIssuer)),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

//! The HTTP handlers over HTTPS, as every real provider is reached: a small axum server on
//! 127.0.0.1 behind TLS, with a certificate made for the test. The handlers' default client
//! verifies certificates, so it refuses this one, says why and sends nothing; a client built
//! with the certificate as a trusted root (what a user does for a private CA) delivers the
//! email over TLS, headers and body intact.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use axum::{Json, Router};
use outbox::FailureKind;
use outbox_handlers::email::{Email, EmailTransport, HttpTransport};
use outbox_handlers::reqwest;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

const KEY: &str = "sk_test_tls_5a4b3c2d1e";

/// A TCP listener that completes the TLS handshake before axum sees the connection, and
/// counts the handshakes the client broke off.
struct TlsListener {
    tcp: TcpListener,
    acceptor: TlsAcceptor,
    refused: Arc<AtomicUsize>,
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((tcp, addr)) = self.tcp.accept().await else {
                continue;
            };
            match self.acceptor.accept(tcp).await {
                Ok(tls) => return (tls, addr),
                Err(_) => {
                    self.refused.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}

/// What the server received: (authorization, idempotency key, body) per request.
type Received = Arc<Mutex<Vec<(String, String, serde_json::Value)>>>;

struct Provider {
    url: String,
    certificate: CertificateDer<'static>,
    received: Received,
    refused: Arc<AtomicUsize>,
}

/// An email provider on 127.0.0.1 over HTTPS, with a self-signed certificate for 127.0.0.1.
async fn provider() -> Provider {
    let issued = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()])
        .expect("a self-signed certificate");
    let certificate = issued.cert.der().clone();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(issued.signing_key.serialize_der()));
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("TLS versions")
    .with_no_client_auth()
    .with_single_cert(vec![certificate.clone()], key)
    .expect("the server certificate");
    config.alpn_protocols = vec![b"http/1.1".to_vec()];

    let received: Received = Arc::default();
    let app = Router::new()
        .route(
            "/emails",
            post(
                |State(received): State<Received>,
                 headers: HeaderMap,
                 Json(body): Json<serde_json::Value>| async move {
                    let header = |name: &str| {
                        headers
                            .get(name)
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or_default()
                            .to_string()
                    };
                    received.lock().unwrap().push((
                        header("authorization"),
                        header("idempotency-key"),
                        body,
                    ));
                    Json(serde_json::json!({ "id": "email_1" }))
                },
            ),
        )
        .with_state(received.clone());
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("https://{}", tcp.local_addr().unwrap());
    let refused = Arc::new(AtomicUsize::new(0));
    let listener = TlsListener {
        tcp,
        acceptor: TlsAcceptor::from(Arc::new(config)),
        refused: refused.clone(),
    };
    tokio::spawn(async move { axum::serve(listener, app).await });
    Provider {
        url,
        certificate,
        received,
        refused,
    }
}

fn transport(url: &str, client: Option<reqwest::Client>) -> HttpTransport {
    let builder = HttpTransport::builder()
        .base_url(url)
        .api_key(KEY)
        .from("Stayhub <bookings@stayhub.example>")
        .timeout(Duration::from_secs(5));
    match client {
        Some(c) => builder.client(c),
        None => builder,
    }
    .build()
    .unwrap()
}

fn email() -> Email {
    Email::new("guest@example.com", "Your booking", "See you soon")
}

#[tokio::test]
async fn the_default_client_refuses_an_untrusted_certificate_and_says_why() {
    let provider = provider().await;
    let error = transport(&provider.url, None)
        .send(&email(), "booking-1:email")
        .await
        .unwrap_err();
    // A certificate can be fixed on the provider's side (an expired one renewed): a retry,
    // with the reason in the message.
    assert_eq!(error.kind(), FailureKind::Retry, "{error}");
    let message = error.to_string();
    assert!(
        message.contains("certificate"),
        "the error names the certificate: {message}"
    );
    assert!(
        !message.contains(KEY),
        "the API key is not in the error: {message}"
    );
    // The server learns of the broken-off handshake a moment after the client gave up.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while provider.refused.load(Ordering::SeqCst) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the server saw no broken-off handshake"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        provider.received.lock().unwrap().is_empty(),
        "nothing was sent"
    );
}

#[tokio::test]
async fn a_client_that_trusts_the_certificate_delivers_over_tls() {
    let provider = provider().await;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(provider.certificate.clone()).unwrap();
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let client = reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .build()
        .unwrap();

    transport(&provider.url, Some(client))
        .send(&email(), "booking-1:email")
        .await
        .unwrap();
    let received = provider.received.lock().unwrap().clone();
    assert_eq!(received.len(), 1, "one request: {received:?}");
    let (authorization, key, body) = &received[0];
    assert_eq!(authorization, &format!("Bearer {KEY}"));
    assert_eq!(key, "booking-1:email");
    assert_eq!(body["to"], serde_json::json!(["guest@example.com"]));
    assert_eq!(body["subject"], "Your booking");
    assert_eq!(provider.refused.load(Ordering::SeqCst), 0);
}

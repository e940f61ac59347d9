//! The unit tests' client: real HTTP/1.1 over TCP, one connection kept alive across requests.

use std::net::SocketAddr;

use bytes::Bytes;
use http::{header, HeaderMap, Method, Request};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpStream;

/// An answer: its status, headers and JSON body (`Null` when the body is not JSON).
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Value,
}

/// One connection to a remote, kept alive between requests.
pub(crate) struct Client {
    addr: SocketAddr,
    send: SendRequest<Full<Bytes>>,
}

impl Client {
    pub(crate) async fn connect(addr: SocketAddr) -> std::io::Result<Client> {
        let stream = TcpStream::connect(addr).await?;
        let (send, conn) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(std::io::Error::other)?;
        tokio::spawn(conn);
        Ok(Client { addr, send })
    }

    /// Whether the connection has ended (closed by either side).
    pub(crate) fn is_closed(&self) -> bool {
        self.send.is_closed()
    }

    /// Sends `request` as is and reads the whole answer.
    pub(crate) async fn send(
        &mut self,
        request: Request<Full<Bytes>>,
    ) -> Result<Answer, hyper::Error> {
        self.send.ready().await?;
        let (parts, body) = self.send.send_request(request).await?.into_parts();
        let bytes = body.collect().await?.to_bytes();
        Ok(Answer {
            status: parts.status.as_u16(),
            headers: parts.headers,
            body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        })
    }

    pub(crate) async fn get(&mut self, path_and_query: &str) -> Result<Answer, hyper::Error> {
        let request = self.request(Method::GET, path_and_query, Bytes::new());
        self.send(request).await
    }

    pub(crate) async fn post(&mut self, path: &str, body: &Value) -> Result<Answer, hyper::Error> {
        let request = self.request(Method::POST, path, Bytes::from(body.to_string()));
        self.send(request).await
    }

    fn request(&self, method: Method, path: &str, body: Bytes) -> Request<Full<Bytes>> {
        Request::builder()
            .method(method)
            .uri(path)
            .header(header::HOST, self.addr.to_string())
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(body))
            .unwrap()
    }
}

/// A `GET` over a connection of its own.
pub(crate) async fn get(addr: SocketAddr, path_and_query: &str) -> Answer {
    let mut client = Client::connect(addr).await.unwrap();
    client.get(path_and_query).await.unwrap()
}

/// A `POST` over a connection of its own.
pub(crate) async fn post(
    addr: SocketAddr,
    path: &str,
    body: &Value,
) -> Result<Answer, hyper::Error> {
    let mut client = Client::connect(addr).await.unwrap();
    client.post(path, body).await
}

//! Lookups: the records whose body fields equal the query's values, in creation order, whole
//! or in pages.

use http::{header, StatusCode};
use serde_json::{json, Value};

use crate::config::LookupPaging;
use crate::response::{error_response, json_response, Resp};
use crate::store::{field_text, Record, Store};

/// How a lookup is answered in pages: at most `size` matches each, led to as `style` says.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Paging {
    pub(crate) size: usize,
    pub(crate) style: LookupPaging,
}

/// A lookup's query string, read.
struct Query<'q> {
    /// Field conditions, decoded.
    conditions: Vec<(String, String)>,
    /// The conditions as the client wrote them, for next-page URLs.
    raw: Vec<&'q str>,
    /// The page asked for, from 1.
    page: usize,
}

impl<'q> Query<'q> {
    /// Reads `field=value&...`; when `paged`, `page=N` is the page number (a whole number from
    /// 1; none is 1), not a condition. `None`: `page` is not such a number.
    fn parse(query: &'q str, paged: bool) -> Option<Query<'q>> {
        let mut read = Query {
            conditions: Vec::new(),
            raw: Vec::new(),
            page: 1,
        };
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let (k, v) = (decode(k), decode(v));
            if paged && k == "page" {
                read.page = v.parse().ok().filter(|&n| n >= 1)?;
            } else {
                read.conditions.push((k, v));
                read.raw.push(pair);
            }
        }
        Some(read)
    }

    /// `here` with this query's conditions and `page=N`.
    fn page_url(&self, here: &str, page: usize) -> String {
        let mut url = format!("{here}?");
        for pair in &self.raw {
            url.push_str(pair);
            url.push('&');
        }
        url.push_str(&format!("page={page}"));
        url
    }
}

fn decode(s: &str) -> String {
    percent_encoding::percent_decode_str(&s.replace('+', " "))
        .decode_utf8_lossy()
        .into_owned()
}

/// Answers the lookup `query` from the records created at or before `visible_before`: all
/// matches as one JSON array, or with `paging` the page asked for. `here` is the absolute URL
/// of the lookup path, which next-page URLs start with.
pub(crate) fn answer(
    store: &Store,
    identity_field: &str,
    visible_before: u64,
    query: &str,
    paging: Option<Paging>,
    here: &str,
) -> Resp {
    let Some(query) = Query::parse(query, paging.is_some()) else {
        return error_response(
            StatusCode::BAD_REQUEST,
            "page must be a whole number from 1",
        );
    };
    let matches = |r: &&Record| {
        r.created_at <= visible_before
            && query
                .conditions
                .iter()
                .all(|(k, v)| field_text(&r.body, k).as_deref() == Some(v.as_str()))
    };
    // Both candidate lists are in creation order, which pages keep.
    let candidates: Box<dyn Iterator<Item = &Record>> =
        match query.conditions.iter().find(|(k, _)| k == identity_field) {
            Some((_, v)) => Box::new(
                store
                    .by_identity
                    .get(v)
                    .into_iter()
                    .flatten()
                    .map(|&i| &store.records[i]),
            ),
            None => Box::new(store.records.iter()),
        };
    let found = candidates.filter(matches).map(item);
    let Some(paging) = paging else {
        return json_response(StatusCode::OK, &Value::Array(found.collect()));
    };
    let mut rest = found.skip((query.page - 1).saturating_mul(paging.size));
    let items: Vec<Value> = rest.by_ref().take(paging.size).collect();
    let next = rest.next().map(|_| query.page_url(here, query.page + 1));
    match paging.style {
        LookupPaging::Body => {
            json_response(StatusCode::OK, &json!({ "items": items, "next": next }))
        }
        LookupPaging::Link => {
            let mut resp = json_response(StatusCode::OK, &Value::Array(items));
            // The URL is made of a request's valid URI and Host: always a valid header value.
            if let Some(link) = next.and_then(|url| {
                header::HeaderValue::from_str(&format!("<{url}>; rel=\"next\"")).ok()
            }) {
                resp.headers_mut().insert(header::LINK, link);
            }
            resp
        }
        LookupPaging::Offset => json_response(StatusCode::OK, &Value::Array(items)),
    }
}

fn item(r: &Record) -> Value {
    json!({ "id": r.id, "created_at": r.created_at, "body": r.body })
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use http::Request;
    use http_body_util::Full;
    use serde_json::json;

    use crate::testing::{self, Answer, Client};
    use crate::{LookupPaging, Sim, SimConfig};

    /// A remote with page size 2 and seven records: five of group `a` (`a-0`..`a-4`, created
    /// in that order) between two of group `b`. Every record has a `page` field too, which a
    /// paged lookup never takes for a condition.
    async fn seven_records(style: LookupPaging) -> Sim {
        let sim = Sim::start(SimConfig {
            lookup_page_size: Some(2),
            lookup_paging: style,
            ..SimConfig::default()
        })
        .await
        .unwrap();
        let mut client = Client::connect(sim.addr()).await.unwrap();
        let create = sim.config().create_path.clone();
        let mut keys = vec!["b-0".to_string()];
        keys.extend((0..5).map(|i| format!("a-{i}")));
        keys.push("b-1".into());
        for key in keys {
            let body = json!({"request_key": key, "group": &key[..1], "page": "7"});
            assert_eq!(client.post(&create, &body).await.unwrap().status, 201);
        }
        sim
    }

    /// The `request_key`s of a page's records, in the answer's order.
    fn keys(items: &serde_json::Value) -> Vec<String> {
        items
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["body"]["request_key"].as_str().unwrap().to_string())
            .collect()
    }

    /// The path and query of a next-page URL, which must be absolute and on this remote.
    fn path_of(sim: &Sim, url: &str) -> String {
        url.strip_prefix(&sim.base_url())
            .unwrap_or_else(|| panic!("{url} is not on {}", sim.base_url()))
            .to_string()
    }

    /// Follows a lookup's pages from its first, with `next` reading a page's next-page URL,
    /// and `items` its records: every page's keys.
    async fn follow(
        sim: &Sim,
        next: impl Fn(&Answer) -> Option<String>,
        items: impl Fn(&Answer) -> &serde_json::Value,
    ) -> Vec<Vec<String>> {
        let mut pages = Vec::new();
        let mut url = Some(format!("{}?group=a", sim.lookup_url()));
        while let Some(at) = url {
            let answer = testing::get(sim.addr(), &path_of(sim, &at)).await;
            assert_eq!(answer.status, 200, "{answer:?}");
            pages.push(keys(items(&answer)));
            url = next(&answer);
            assert!(pages.len() <= 5, "the pages do not end: {pages:?}");
        }
        pages
    }

    fn five_in_three_pages() -> Vec<Vec<String>> {
        vec![
            vec!["a-0".into(), "a-1".into()],
            vec!["a-2".into(), "a-3".into()],
            vec!["a-4".into()],
        ]
    }

    #[tokio::test]
    async fn body_pages_carry_the_next_url_and_the_last_one_null() {
        let sim = seven_records(LookupPaging::Body).await;
        let pages = follow(
            &sim,
            |answer| {
                let next = &answer.body["next"];
                assert!(next.is_null() || next.is_string(), "{answer:?}");
                next.as_str().map(str::to_string)
            },
            |answer| &answer.body["items"],
        )
        .await;
        assert_eq!(pages, five_in_three_pages());
        let second = testing::get(sim.addr(), "/records?group=a&page=2").await;
        assert_eq!(
            second.body["next"],
            json!(format!("{}/records?group=a&page=3", sim.base_url()))
        );
    }

    #[tokio::test]
    async fn link_pages_carry_a_next_link_header_but_the_last() {
        let sim = seven_records(LookupPaging::Link).await;
        let pages = follow(
            &sim,
            |answer| {
                let link = answer.headers.get(http::header::LINK)?.to_str().unwrap();
                let url = link
                    .strip_prefix('<')
                    .and_then(|l| l.strip_suffix(">; rel=\"next\""))
                    .unwrap_or_else(|| panic!("not a next link: {link}"));
                Some(url.to_string())
            },
            |answer| &answer.body,
        )
        .await;
        assert_eq!(pages, five_in_three_pages());
    }

    #[tokio::test]
    async fn offset_pages_are_asked_for_by_number_until_a_short_one() {
        let sim = seven_records(LookupPaging::Offset).await;
        let mut pages = Vec::new();
        for page in 1..=4 {
            let answer = testing::get(sim.addr(), &format!("/records?group=a&page={page}")).await;
            assert_eq!(answer.status, 200);
            assert!(answer.headers.get(http::header::LINK).is_none());
            pages.push(keys(&answer.body));
        }
        let mut expected = five_in_three_pages();
        expected.push(vec![]);
        assert_eq!(pages, expected);
        // No `page` is page 1.
        let first = testing::get(sim.addr(), "/records?group=a").await;
        assert_eq!(keys(&first.body), expected[0]);
    }

    #[tokio::test]
    async fn next_urls_keep_the_conditions_as_written_and_the_host_the_client_used() {
        let sim = seven_records(LookupPaging::Body).await;
        let mut client = Client::connect(sim.addr()).await.unwrap();
        let request = Request::get("/records?group=%61")
            .header(http::header::HOST, "sim.example:8600")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let first = client.send(request).await.unwrap();
        assert_eq!(keys(&first.body["items"]), ["a-0", "a-1"]);
        assert_eq!(
            first.body["next"],
            "http://sim.example:8600/records?group=%61&page=2"
        );
        // `page` anywhere in the query; a condition on the identity field.
        let only = client
            .get("/records?page=1&request_key=a-%34")
            .await
            .unwrap();
        assert_eq!(keys(&only.body["items"]), ["a-4"]);
        assert!(only.body["next"].is_null());
    }

    #[tokio::test]
    async fn a_page_that_is_not_a_whole_number_from_1_is_refused() {
        let sim = seven_records(LookupPaging::Body).await;
        for page in ["0", "x", "-1", ""] {
            let answer = testing::get(sim.addr(), &format!("/records?page={page}")).await;
            assert_eq!(answer.status, 400, "page={page}: {answer:?}");
            assert_eq!(answer.body["error"], "page must be a whole number from 1");
        }
    }

    #[tokio::test]
    async fn without_a_page_size_a_lookup_answers_every_match_and_page_is_a_field() {
        let sim = seven_records(LookupPaging::Body).await;
        sim.set_lookup_page_size(None).unwrap();
        let all = testing::get(sim.addr(), "/records?group=a").await;
        assert_eq!(keys(&all.body), ["a-0", "a-1", "a-2", "a-3", "a-4"]);
        let by_page = testing::get(sim.addr(), "/records?group=b&page=7").await;
        assert_eq!(keys(&by_page.body), ["b-0", "b-1"]);
        let none = testing::get(sim.addr(), "/records?group=b&page=1").await;
        assert_eq!(none.body, json!([]));
        // Paged again from now on; a size of 0 is refused, naming the field.
        sim.set_lookup_page_size(Some(3)).unwrap();
        let first = testing::get(sim.addr(), "/records?group=a").await;
        assert_eq!(keys(&first.body["items"]), ["a-0", "a-1", "a-2"]);
        let err = sim.set_lookup_page_size(Some(0)).unwrap_err();
        assert_eq!(err.to_string(), "lookup_page_size: must be at least 1");
    }
}

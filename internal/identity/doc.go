// Package identity authenticates muster's callers. Every /v1 call presents a
// bearer JWT; a Verifier checks it against the configured OIDC issuers and
// turns it into a Principal, which the rest of muster authorises and audits.
// The package knows nothing of routes or status codes: the server maps
// ErrNoToken and ErrInvalidToken to 401, ErrIssuerUnavailable to 503.
//
// # Verification
//
// The unverified "iss" of a token only routes it to a configured issuer; an
// unconfigured issuer is refused without any network traffic. Each issuer is
// discovered lazily through go-oidc (oidc.NewProvider) on its first token, and
// its *oidc.IDTokenVerifier is cached once discovery succeeds. Signature,
// "iss", "aud", "exp" and "nbf" are checked by that verifier and nothing
// else, so production issuers (Kubernetes service-account tokens, IRSA) and
// the dev issuer share one code path.
//
// Discovery failures are not cached as successes: the next call retries, but
// at most once per 5 s per issuer; in between, callers get the last error
// immediately. A discovery runs in a goroutine of its own with a 10 s timeout,
// detached from the request that started it, and concurrent callers wait for
// it rather than start their own. A caller whose context ends stops waiting;
// the discovery continues, so one impatient client cannot fail discovery for
// everyone and trigger the retry interval. The mutex guarding an issuer is
// never held across an HTTP call.
//
// The key set is muster's own (keySet), not go-oidc's RemoteKeySet, which
// refetches an issuer's keys for every token whose key it does not hold,
// so that forged tokens with fresh key IDs cost one fetch each. Here a
// token whose key ID is held but whose signature is wrong costs no fetch,
// and one with an unknown key ID costs a fetch only when the last one
// started at least 10 s ago: at most one key-set fetch per issuer per
// 10 s, whatever is presented. A key rotation is picked up within 10 s;
// a failed fetch is answered for (ErrIssuerUnavailable) for 10 s. Fetches
// run detached from the request, with a 10 s timeout, shared by
// concurrent callers.
//
// # Naming
//
// The first configured issuer is the home issuer (under muster dev, the
// first of MUSTER_ISSUERS if any are set, else the dev issuer). Principal.String, the name the audit log, the rate limiters
// and the access log use, is "kind:subject" (or "kind:service/subject")
// for the home issuer's principals, as it has always been, and
// "issuer#kind:subject" for any other issuer's, so the same subject at two
// issuers is two actors. Keep the home issuer first: moving another issuer
// there would give its principals the names the old home's had.
//
// # Claims
//
// Besides the registered claims, tokens carry muster's own, matched by exact
// name:
//
//	muster_kind       required: workload, prober, tool or operator
//	muster_service    workload (required), prober (optional)
//	muster_team       operator, tool (optional)
//	muster_role       operator, tool (optional, viewer by default)
//	muster_addresses  any kind: IP addresses the issuer vouches for
//
// A claim on a kind it does not apply to is refused rather than ignored: it
// means the issuer is configured wrongly, and a silently dropped role is a
// worse surprise than a clear refusal. "sub" is required; service names
// follow the registry's rule (a lowercase DNS label). The same checks (NewPrincipal) run
// in the dev issuer's Mint (internal/devissuer), so it never mints a token
// Verify would refuse.
//
// # Platform issuers
//
// A Kubernetes service-account issuer or an AWS web-identity issuer cannot
// write muster's claims. An issuer configured with a ClaimMapping is read
// by its own claims instead: kubernetes.io.namespace and
// kubernetes.io.serviceaccount.name (or the IAM role of an AWS role
// session ARN) name a muster service, and the principal is a workload of
// it; kubernetes.io.pod.uid sets Principal.Pod and Cluster, which the
// evaluator binds to that pod's reconciled instance (a self-report for any
// other instance is refused). Such an issuer is trusted for those
// workloads only: an unmapped account is refused, and so is any token of
// it carrying muster_* claims, so it can never mint an operator, a tool, a
// prober or a role. IssuerConfig.Kinds narrows a plain issuer the same way.
//
// # Client certificates
//
// TrustDomains maps a client certificate, once verified against the
// client CA bundle (internal/tlsreload.ClientCAs; this package does no
// chain verification), to a workload by its SPIFFE ID: per trust domain,
// a path template of literal segments and {name} placeholders, exactly
// one of them {service}, matched segment for segment. The principal's
// Issuer is "spiffe://" and the trust domain, its Subject the full ID,
// its Expiry the certificate's notAfter, and its Addresses the
// certificate's IP SANs: the CA vouches for them as an issuer vouches for
// muster_addresses, so they prove a registered address like the claim
// does. It is never Home and never more than a workload. Errors wrap
// ErrCertificateUnmapped; the server counts and audits them as
// FailureCertificateUnmapped, and a workload token contradicted by a
// certificate as FailureConflictingProofs.
//
// Error texts wrapping ErrInvalidToken are short reasons meant for the
// caller ("token expired", `unknown kind "x"`); untrusted values in them are
// truncated and quoted. No error ever contains the token.
//
// # Dev issuer
//
// The issuer of `muster dev` and `muster token` lives in internal/devissuer:
// an OpenID Provider whose tokens the server verifies over HTTP like any
// other issuer's, through this package's Verifier; there is no shortcut.
package identity

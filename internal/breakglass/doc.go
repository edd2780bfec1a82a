// Package breakglass is the audited, expiring way in for an operator when
// no identity provider can vouch for one: the first admin of a new region
// (whose home issuer is not set up yet, or is a platform issuer that
// mints workload tokens only), or an identity-provider outage.
//
// # Grants
//
// `muster breakglass` runs where the region's signing key is (in a
// muster pod: it reads the same environment as muster serve). Issue
// writes a grant row (operator, role, reason, who ran it on which host,
// issued and expiry times) sealed with the region's key, and the audit
// row "breakglass.issue", in one transaction, then mints a JWT signed
// with the same key (EdDSA): "iss" is Issuer(region), "aud" the
// audience, "sub" the operator, "exp" the grant's expiry, "jti" its id,
// muster_role its role. A grant lives at most MaxTTL (DefaultTTL unless
// asked), and needs a reason. Revoke ends it (audited); List shows them.
//
// # Acceptance
//
// Authenticator sits in front of the server's identity.Verifier and takes
// the tokens whose "iss" is this region's break-glass issuer; every other
// token goes to the Verifier as before. One is accepted only when
//   - its signature verifies with a key the region trusts (the signing
//     key, and the public keys of a rotation);
//   - it is unexpired, with Leeway for clocks;
//   - its grant row exists, its seal verifies, and the row says what the
//     token says (operator, role, expiry, region);
//   - the grant is not revoked.
//
// So PostgreSQL's administrators, who never hold the key, cannot mint,
// widen or extend a grant: a row inserted, edited or deleted by hand only
// refuses its token. The principal is an operator of the grant's role
// named "breakglass#operator:NAME" (Principal.String), so every action it
// takes is audited under that name and no identity provider's subject can
// pass for it.
//
// Grant rows are read at most once per CacheFor (5 s) per grant on each
// replica, so a token costs a signature check, not a query, per call; a
// revocation is honoured everywhere within that bound. Every refusal is
// counted (muster_breakglass_refusals_total) and answered 401 by the
// server, which audits it like any refused token (per source address per
// minute); the refusal of a token that really is a grant's (signed by the
// region's key: expired, revoked, its row gone or changed) is also
// audited on its own, "breakglass.refuse" with the grant's id, at most
// once per grant and reason per minute on each replica. The first use of
// a grant at each replica is audited as "breakglass.use".
//
// # Alarms
//
// Watch lists the live grants every few seconds: breakglass_active is open
// while one is (the overview's banner, GET /v1/alarms, the alert rules),
// and breakglass_unsealed while a live row's seal does not verify (a row
// written by hand; its token is refused anyway).
package breakglass

// Package devissuer is the OpenID issuer built into `muster dev` and
// `muster token`. Its RSA key is kept in a file so tokens survive restarts
// and so a separate process can mint for the running server; the issuer
// URL is saved next to it for the same reason. It is an OpenID Provider
// built on zitadel/oidc's op package: discovery, JWKS, and the
// authorization code flow with PKCE, whose login step is a sign-in page
// listing the development users (Users) so the web UI signs in exactly as
// it does against a production issuer. The server verifies its tokens over
// HTTP through identity.Verifier like any other issuer's; there is no
// shortcut.
//
// Mint checks a token request with identity.NewPrincipal, the rules
// Verify applies, so it never mints a token muster would refuse for its
// claims. The package uses identity's exported vocabulary (kinds, roles,
// claim names) and nothing else of it, so identity holds principals and
// verification only.
package devissuer

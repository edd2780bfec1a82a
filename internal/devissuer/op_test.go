package devissuer_test

import (
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"testing"

	"github.com/coreos/go-oidc/v3/oidc"
	"golang.org/x/oauth2"

	"github.com/musterhq/muster/internal/devissuer"
)

// TestDevIssuerCodeFlow runs the authorization code flow with PKCE against
// the dev issuer the way a web client does: authorize, sign in on the dev
// page, exchange the code, verify the ID token with go-oidc.
func TestDevIssuerCodeFlow(t *testing.T) {
	t.Parallel()
	for _, u := range devissuer.Users() {
		t.Run(u.Subject, func(t *testing.T) {
			t.Parallel()
			s := newDevServer(t)
			const redirect = "http://127.0.0.1:1/auth/callback"
			if err := s.issuer.RegisterClient(devissuer.Client{ID: "web", Secret: "s3cret", RedirectURIs: []string{redirect}}); err != nil {
				t.Fatal(err)
			}
			ctx := oidc.ClientContext(t.Context(), s.srv.Client())
			provider, err := oidc.NewProvider(ctx, s.URL())
			if err != nil {
				t.Fatal(err)
			}
			conf := oauth2.Config{ClientID: "web", ClientSecret: "s3cret", RedirectURL: redirect,
				Endpoint: provider.Endpoint(), Scopes: []string{oidc.ScopeOpenID}}
			verifier := oauth2.GenerateVerifier()
			authURL := conf.AuthCodeURL("st4te", oidc.Nonce("n0nce"), oauth2.S256ChallengeOption(verifier))

			// The browser: follow redirects until the dev page, submit it,
			// stop at the redirect back to the client.
			jar, _ := cookiejar.New(nil)
			browser := &http.Client{Jar: jar, CheckRedirect: func(r *http.Request, _ []*http.Request) error {
				if strings.HasPrefix(r.URL.String(), redirect) {
					return http.ErrUseLastResponse
				}
				return nil
			}}
			resp, err := browser.Get(authURL)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || resp.Request.URL.Path != issuerPath+"/login" {
				t.Fatalf("authorize landed on %s with %d, want the dev sign-in page", resp.Request.URL, resp.StatusCode)
			}
			id := resp.Request.URL.Query().Get("id")
			req, _ := http.NewRequest("POST", s.URL()+"/login", strings.NewReader(url.Values{"id": {id}, "user": {u.Subject}}.Encode()))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			req.Header.Set("Sec-Fetch-Site", "same-origin")
			resp, err = browser.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			loc, err := url.Parse(resp.Header.Get("Location"))
			if err != nil || resp.StatusCode != http.StatusFound || !strings.HasPrefix(loc.String(), redirect) {
				t.Fatalf("sign-in answered %d Location %q", resp.StatusCode, resp.Header.Get("Location"))
			}
			if loc.Query().Get("state") != "st4te" {
				t.Errorf("state = %q", loc.Query().Get("state"))
			}
			code := loc.Query().Get("code")

			// A wrong PKCE verifier is refused; the right one gets tokens.
			if _, err := conf.Exchange(ctx, code, oauth2.VerifierOption(oauth2.GenerateVerifier())); err == nil {
				t.Error("exchange with a wrong code_verifier succeeded")
			}
			tok, err := conf.Exchange(ctx, code, oauth2.VerifierOption(verifier))
			if err != nil {
				t.Fatalf("exchange: %v", err)
			}
			raw, _ := tok.Extra("id_token").(string)
			idt, err := provider.Verifier(&oidc.Config{ClientID: "web"}).Verify(ctx, raw)
			if err != nil {
				t.Fatalf("verify ID token: %v", err)
			}
			var claims struct {
				Nonce string `json:"nonce"`
				Kind  string `json:"muster_kind"`
				Role  string `json:"muster_role"`
				Team  string `json:"muster_team"`
			}
			if err := idt.Claims(&claims); err != nil {
				t.Fatal(err)
			}
			if idt.Subject != u.Subject || claims.Nonce != "n0nce" || claims.Kind != "operator" ||
				claims.Role != string(u.Role) || claims.Team != u.Team {
				t.Errorf("ID token sub %q claims %+v, want %+v", idt.Subject, claims, u)
			}
			// The code is good once.
			if _, err := conf.Exchange(ctx, code, oauth2.VerifierOption(verifier)); err == nil {
				t.Error("second exchange of the same code succeeded")
			}
		})
	}
}

func TestDevIssuerLoginRefuses(t *testing.T) {
	t.Parallel()
	s := newDevServer(t)
	resp, err := s.srv.Client().Get(s.URL() + "/login?id=nope")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("login page for an unknown request: %d, want 400", resp.StatusCode)
	}
	// A cross-site form post is refused before anything is looked up.
	req, _ := http.NewRequest("POST", s.URL()+"/login", strings.NewReader("id=x&user=alice"))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	resp, err = s.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("cross-site login post: %d, want 403", resp.StatusCode)
	}
}

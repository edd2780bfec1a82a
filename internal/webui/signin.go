package webui

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/coreos/go-oidc/v3/oidc"
	"golang.org/x/oauth2"

	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/views"
)

// Audit actions of the UI.
const (
	actionSignIn      = "ui.sign_in"
	actionSignOut     = "ui.sign_out"
	actionCrossOrigin = "ui.cross_origin"
)

func (u *UI) oauthConfig(p *oidc.Provider) oauth2.Config {
	return oauth2.Config{
		ClientID:     u.cfg.OIDC.ClientID,
		ClientSecret: u.cfg.OIDC.ClientSecret,
		RedirectURL:  u.cfg.OIDC.RedirectURL,
		Endpoint:     p.Endpoint(),
		Scopes:       []string{oidc.ScopeOpenID},
	}
}

func randomToken() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// login starts a sign-in: a fresh state, nonce and PKCE verifier go into the
// session, and the browser goes to the issuer.
func (u *UI) login(w http.ResponseWriter, r *http.Request) {
	if _, ok := u.current(r); ok {
		http.Redirect(w, r, u.safeNext(r.URL.Query().Get("next")), http.StatusSeeOther)
		return
	}
	prov, err := u.oidcProvider(r.Context())
	if err != nil {
		u.log.Warn("sign-in: issuer unavailable", "err", err)
		u.message(w, r, http.StatusServiceUnavailable, "Sign-in unavailable",
			"muster cannot reach its identity provider right now; try again in a moment.")
		return
	}
	state, err1 := randomToken()
	nonce, err2 := randomToken()
	if err := errors.Join(err1, err2); err != nil {
		u.message(w, r, http.StatusInternalServerError, "Sign-in failed", "muster could not generate a sign-in request.")
		return
	}
	verifier := oauth2.GenerateVerifier()
	ctx := r.Context()
	u.sessions.Put(ctx, keyState, state)
	u.sessions.Put(ctx, keyNonce, nonce)
	u.sessions.Put(ctx, keyVerifier, verifier)
	u.sessions.Put(ctx, keyNext, u.safeNext(r.URL.Query().Get("next")))
	conf := u.oauthConfig(prov)
	http.Redirect(w, r, conf.AuthCodeURL(state, oidc.Nonce(nonce), oauth2.S256ChallengeOption(verifier)), http.StatusSeeOther)
}

// safeNext keeps post-sign-in redirects inside the UI.
func (u *UI) safeNext(next string) string {
	b := u.cfg.BasePath
	if (next == b || strings.HasPrefix(next, b+"/")) && !strings.HasPrefix(next, "//") && !strings.ContainsAny(next, "\\\r\n") {
		return next
	}
	return b + "/"
}

// callback finishes a sign-in: the state must match the attempt's, the code
// is exchanged with its PKCE verifier, the ID token is verified and its
// nonce must match. Every outcome is audited.
func (u *UI) callback(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	state := u.sessions.PopString(ctx, keyState)
	nonce := u.sessions.PopString(ctx, keyNonce)
	verifier := u.sessions.PopString(ctx, keyVerifier)
	next := u.sessions.PopString(ctx, keyNext)

	refuse := func(actor, reason string, err error) {
		u.log.Warn("sign-in refused", "reason", reason, "err", err)
		u.audit(r, audit.Entry{ActorKind: "anonymous", Actor: actor, Action: actionSignIn,
			TargetKind: "session", Target: "web", Outcome: audit.Refused, Reason: reason})
		u.message(w, r, http.StatusBadRequest, "Sign-in failed", reason+" Start again from the sign-in link.")
	}
	q := r.URL.Query()
	if e := q.Get("error"); e != "" {
		refuse("anonymous", fmt.Sprintf("The identity provider refused the sign-in (%.64q).", e), nil)
		return
	}
	got := q.Get("state")
	if state == "" || subtle.ConstantTimeCompare([]byte(got), []byte(state)) != 1 {
		refuse("anonymous", "The sign-in response does not belong to a sign-in started in this browser (state mismatch).", nil)
		return
	}
	prov, err := u.oidcProvider(ctx)
	if err != nil {
		u.message(w, r, http.StatusServiceUnavailable, "Sign-in unavailable", "muster cannot reach its identity provider right now; try again in a moment.")
		return
	}
	octx := oidc.ClientContext(ctx, u.cfg.HTTPClient)
	conf := u.oauthConfig(prov)
	tok, err := conf.Exchange(octx, q.Get("code"), oauth2.VerifierOption(verifier))
	if err != nil {
		refuse("anonymous", "The authorization code could not be exchanged.", err)
		return
	}
	raw, _ := tok.Extra("id_token").(string)
	idt, err := prov.VerifierContext(octx, &oidc.Config{ClientID: u.cfg.OIDC.ClientID, Now: u.cfg.Now}).Verify(octx, raw)
	if err != nil {
		refuse("anonymous", "The identity provider's ID token did not verify.", err)
		return
	}
	if nonce == "" || subtle.ConstantTimeCompare([]byte(idt.Nonce), []byte(nonce)) != 1 {
		refuse("anonymous", "The ID token's nonce does not match this sign-in (replayed token?).", nil)
		return
	}
	var claims map[string]any
	if err := idt.Claims(&claims); err != nil {
		refuse("anonymous", "The ID token's claims could not be read.", err)
		return
	}
	team, _ := claims[u.cfg.OIDC.TeamClaim].(string)
	role, _ := claims[u.cfg.OIDC.RoleClaim].(string)
	p, err := identity.NewOperator(idt.Issuer, idt.Subject, team, role)
	if err != nil {
		refuse("operator:"+truncate(idt.Subject), "The ID token's claims are not acceptable: "+err.Error()+".", nil)
		return
	}
	p.Home = p.Issuer == u.cfg.OIDC.HomeIssuer
	// A new token for the signed-in session: whatever token the browser
	// had before (fixation) is worthless now.
	if err := u.sessions.RenewToken(ctx); err != nil {
		u.message(w, r, http.StatusServiceUnavailable, "Sign-in failed", "The session could not be created; try again.")
		return
	}
	now := u.cfg.Now()
	u.sessions.Put(ctx, keyIssuer, p.Issuer)
	u.sessions.Put(ctx, keySubject, p.Subject)
	u.sessions.Put(ctx, keyTeam, p.Team)
	u.sessions.Put(ctx, keyRole, string(p.Role))
	u.sessions.Put(ctx, keySignedIn, now.UnixNano())
	u.sessions.Put(ctx, keyLastSeen, now.UnixNano())
	u.audit(r, audit.Entry{ActorKind: string(p.Kind), Actor: p.String(), Action: actionSignIn,
		TargetKind: "session", Target: "web", Outcome: audit.Accepted, Reason: "role " + string(p.Role)})
	http.Redirect(w, r, u.safeNext(next), http.StatusSeeOther)
}

// logout ends the session (POST only, behind the cross-origin check).
func (u *UI) logout(w http.ResponseWriter, r *http.Request) {
	if p, ok := u.current(r); ok {
		u.audit(r, audit.Entry{ActorKind: string(p.Kind), Actor: p.String(), Action: actionSignOut,
			TargetKind: "session", Target: "web", Outcome: audit.Accepted})
	}
	if err := u.sessions.Destroy(r.Context()); err != nil {
		u.log.Warn("destroy session", "err", err)
	}
	http.Redirect(w, r, u.cfg.BasePath+"/signed-out", http.StatusSeeOther)
}

func (u *UI) signedOut(w http.ResponseWriter, r *http.Request) {
	u.render(w, r, http.StatusOK, views.MessagePage(views.Message{
		Page:    views.Page{Base: u.cfg.BasePath, Now: u.cfg.Now(), Title: "Signed out"},
		Heading: "Signed out", Text: "You are signed out of muster.",
		Link: u.cfg.BasePath + "/login", LinkText: "Sign in again",
	}))
}

// crossOriginRefused answers and audits a state-changing request that
// http.CrossOriginProtection refused.
func (u *UI) crossOriginRefused(w http.ResponseWriter, r *http.Request) {
	kind, actor := "anonymous", "anonymous"
	// The deny handler runs before the session is loaded, so the actor is
	// looked up directly; a failure only makes the record anonymous.
	if c, err := r.Cookie(u.sessions.Cookie.Name); err == nil {
		if ctx, err := u.sessions.Load(r.Context(), c.Value); err == nil {
			if sub := u.sessions.GetString(ctx, keySubject); sub != "" {
				kind, actor = string(identity.KindOperator), "operator:"+sub
			}
		}
	}
	origin := r.Header.Get("Origin")
	if origin == "" {
		origin = "Sec-Fetch-Site: " + r.Header.Get("Sec-Fetch-Site")
	}
	u.audit(r, audit.Entry{ActorKind: kind, Actor: actor, Action: actionCrossOrigin,
		TargetKind: "path", Target: truncate(r.URL.Path), Outcome: audit.Refused,
		Reason: truncate(r.Method + " from another origin (" + origin + ") refused")})
	u.message(w, r, http.StatusForbidden, "Refused",
		"This request came from another site. muster only accepts forms submitted from its own pages.")
}

// audit records e; a failure is logged, since the answer has already been
// decided.
func (u *UI) audit(r *http.Request, e audit.Entry) {
	if _, err := audit.AppendAlone(r.Context(), u.cfg.Pool, u.cfg.Now(), e); err != nil {
		u.log.Error("audit", "action", e.Action, "err", err)
	}
}

// truncate bounds an untrusted value for an audit record, cutting at a
// rune boundary.
func truncate(s string) string {
	const limit = 200
	if len(s) <= limit {
		return s
	}
	cut := limit
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

package webui

import (
	"bytes"
	"context"
	"net/http"
	"net/url"
	"time"

	"github.com/a-h/templ"

	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/views"
)

// Session keys. Times are stored as Unix nanoseconds of cfg.Now.
const (
	keyIssuer   = "iss"
	keySubject  = "sub"
	keyTeam     = "team"
	keyRole     = "role"
	keySignedIn = "signed_in_at"
	keyLastSeen = "last_seen_at"

	// One sign-in attempt: checked and removed on the callback.
	keyState    = "login_state"
	keyNonce    = "login_nonce"
	keyVerifier = "login_verifier"
	keyNext     = "login_next"
)

// touchEvery limits session writes: last-seen is only rewritten when it is
// this old, so a burst of page loads costs one store write.
const touchEvery = 15 * time.Second

type principalKey struct{}

// principalFrom returns the signed-in operator of a request that went
// through page or Action.
func principalFrom(ctx context.Context) identity.Principal {
	p, _ := ctx.Value(principalKey{}).(identity.Principal)
	return p
}

// current returns the session's operator, or false when nobody is signed in
// or the session has run past its idle or absolute timeout, in which case
// the session is destroyed.
func (u *UI) current(r *http.Request) (identity.Principal, bool) {
	ctx := r.Context()
	sub := u.sessions.GetString(ctx, keySubject)
	if sub == "" {
		return identity.Principal{}, false
	}
	now := u.cfg.Now()
	signedIn := time.Unix(0, u.sessions.GetInt64(ctx, keySignedIn))
	lastSeen := time.Unix(0, u.sessions.GetInt64(ctx, keyLastSeen))
	if now.Sub(lastSeen) > u.cfg.IdleTimeout || now.Sub(signedIn) > u.cfg.Lifetime {
		if err := u.sessions.Destroy(ctx); err != nil {
			u.log.Warn("destroy expired session", "err", err)
		}
		return identity.Principal{}, false
	}
	if now.Sub(lastSeen) >= touchEvery {
		u.sessions.Put(ctx, keyLastSeen, now.UnixNano())
	}
	p, err := identity.NewOperator(u.sessions.GetString(ctx, keyIssuer), sub,
		u.sessions.GetString(ctx, keyTeam), u.sessions.GetString(ctx, keyRole))
	if err != nil {
		// Only what the callback validated is ever stored.
		u.log.Error("session holds an invalid principal", "err", err)
		return identity.Principal{}, false
	}
	p.Home = p.Issuer == u.cfg.OIDC.HomeIssuer
	return p, true
}

// page wraps a page handler: without a live session the browser is sent to
// sign in and brought back afterwards.
func (u *UI) page(h func(w http.ResponseWriter, r *http.Request, p views.Page)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, ok := u.current(r)
		if !ok {
			http.Redirect(w, r, u.cfg.BasePath+"/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
			return
		}
		ctx := context.WithValue(r.Context(), principalKey{}, p)
		h(w, r.WithContext(ctx), u.pageFor(p))
	})
}

func (u *UI) pageFor(p identity.Principal) views.Page {
	return views.Page{Base: u.cfg.BasePath, Subject: p.Subject, Role: string(p.Role), Team: p.Team, Now: u.cfg.Now()}
}

// message renders a message page with the given status.
func (u *UI) message(w http.ResponseWriter, r *http.Request, status int, heading, text string) {
	pg := views.Page{Base: u.cfg.BasePath, Now: u.cfg.Now(), Title: heading}
	if p, ok := r.Context().Value(principalKey{}).(identity.Principal); ok {
		pg = u.pageFor(p)
		pg.Title = heading
	}
	u.render(w, r, status, views.MessagePage(views.Message{Page: pg, Status: status, Heading: heading, Text: text,
		Link: u.cfg.BasePath + "/", LinkText: "Back to the overview"}))
}

// render writes a component with status; it is rendered to memory first so
// a template error does not leave half a page.
func (u *UI) render(w http.ResponseWriter, r *http.Request, status int, c templ.Component) {
	var buf bytes.Buffer
	if err := c.Render(r.Context(), &buf); err != nil {
		u.log.Error("render page", "path", r.URL.Path, "err", err)
		http.Error(w, "the page could not be rendered", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes()) // the client may be gone
}

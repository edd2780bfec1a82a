package devissuer

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/zitadel/oidc/v3/pkg/oidc"
	"github.com/zitadel/oidc/v3/pkg/op"

	"github.com/musterhq/muster/internal/identity"
)

// User is a development user offered by the dev issuer's sign-in page.
type User struct {
	Subject string
	Role    identity.Role
	Team    string
}

// Users are the users of the dev sign-in page: an admin, an operator of
// the payments team and a viewer.
func Users() []User {
	return []User{
		{Subject: "alice", Role: identity.RoleAdmin},
		{Subject: "oscar", Role: identity.RoleOperator, Team: "payments"},
		{Subject: "otto", Role: identity.RoleOperator, Team: "payments"},
		{Subject: "vera", Role: identity.RoleViewer},
	}
}

func findUser(sub string) (User, bool) {
	for _, u := range Users() {
		if u.Subject == sub {
			return u, true
		}
	}
	return User{}, false
}

// Client is an OAuth client of the dev issuer: the web UI of `muster dev`.
type Client struct {
	ID           string
	Secret       string
	RedirectURIs []string
}

const (
	// authRequestTTL bounds how long a sign-in may take, from the
	// authorization request to the code exchange.
	authRequestTTL = 10 * time.Minute
	idTokenTTL     = 10 * time.Minute
	accessTokenTTL = 10 * time.Minute
	// maxAuthRequests bounds the memory unfinished sign-ins can take.
	maxAuthRequests = 10_000
)

// devStorage is the op.Storage of the dev issuer: clients, authorization
// requests and codes are kept in memory, which is enough for one dev
// process; the signing key is the issuer's key on disk.
type devStorage struct {
	issuer *Issuer

	mu       sync.Mutex
	clients  map[string]Client
	requests map[string]*devAuthRequest // by id
	codes    map[string]string          // code -> request id
}

func newDevStorage(d *Issuer) *devStorage {
	return &devStorage{
		issuer:   d,
		clients:  map[string]Client{},
		requests: map[string]*devAuthRequest{},
		codes:    map[string]string{},
	}
}

var _ op.Storage = (*devStorage)(nil)

// devAuthRequest is one authorization request, from /authorize to the code
// exchange. Its fields are written under devStorage.mu and read by the op
// package from a copy.
type devAuthRequest struct {
	id       string
	created  time.Time
	req      oidc.AuthRequest
	subject  string // set when the user signed in
	authTime time.Time
}

func (a *devAuthRequest) GetID() string         { return a.id }
func (a *devAuthRequest) GetACR() string        { return "" }
func (a *devAuthRequest) GetAMR() []string      { return []string{"pwd"} }
func (a *devAuthRequest) GetAudience() []string { return []string{a.req.ClientID} }
func (a *devAuthRequest) GetAuthTime() time.Time {
	return a.authTime
}
func (a *devAuthRequest) GetClientID() string { return a.req.ClientID }
func (a *devAuthRequest) GetCodeChallenge() *oidc.CodeChallenge {
	if a.req.CodeChallenge == "" {
		return nil
	}
	return &oidc.CodeChallenge{Challenge: a.req.CodeChallenge, Method: a.req.CodeChallengeMethod}
}
func (a *devAuthRequest) GetNonce() string                   { return a.req.Nonce }
func (a *devAuthRequest) GetRedirectURI() string             { return a.req.RedirectURI }
func (a *devAuthRequest) GetResponseType() oidc.ResponseType { return a.req.ResponseType }
func (a *devAuthRequest) GetResponseMode() oidc.ResponseMode { return a.req.ResponseMode }
func (a *devAuthRequest) GetScopes() []string                { return a.req.Scopes }
func (a *devAuthRequest) GetState() string                   { return a.req.State }
func (a *devAuthRequest) GetSubject() string                 { return a.subject }
func (a *devAuthRequest) Done() bool                         { return a.subject != "" }

type notFoundError struct{ what string }

func (e notFoundError) Error() string { return e.what + " not found" }
func (notFoundError) IsNotFound()     {}

func randomID() (string, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}

func (s *devStorage) registerClient(c Client) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.clients[c.ID] = c
}

// expireLocked drops authorization requests older than authRequestTTL.
func (s *devStorage) expireLocked(now time.Time) {
	for id, a := range s.requests {
		if now.Sub(a.created) > authRequestTTL {
			delete(s.requests, id)
		}
	}
	for code, id := range s.codes {
		if _, ok := s.requests[id]; !ok {
			delete(s.codes, code)
		}
	}
}

func (s *devStorage) CreateAuthRequest(_ context.Context, req *oidc.AuthRequest, _ string) (op.AuthRequest, error) {
	id, err := randomID()
	if err != nil {
		return nil, fmt.Errorf("new auth request id: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	s.expireLocked(now)
	if len(s.requests) >= maxAuthRequests {
		return nil, oidc.ErrServerError().WithDescription("too many sign-ins in progress")
	}
	a := &devAuthRequest{id: id, created: now, req: *req}
	s.requests[id] = a
	c := *a
	return &c, nil
}

func (s *devStorage) AuthRequestByID(_ context.Context, id string) (op.AuthRequest, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expireLocked(time.Now())
	a, ok := s.requests[id]
	if !ok {
		return nil, notFoundError{"auth request"}
	}
	c := *a
	return &c, nil
}

func (s *devStorage) AuthRequestByCode(_ context.Context, code string) (op.AuthRequest, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expireLocked(time.Now())
	a, ok := s.requests[s.codes[code]]
	if !ok {
		return nil, notFoundError{"code"}
	}
	c := *a
	return &c, nil
}

func (s *devStorage) SaveAuthCode(_ context.Context, id, code string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.requests[id]; !ok {
		return notFoundError{"auth request"}
	}
	s.codes[code] = id
	return nil
}

// DeleteAuthRequest runs when the code is exchanged, so a code is good for
// one exchange only.
func (s *devStorage) DeleteAuthRequest(_ context.Context, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.requests, id)
	for code, rid := range s.codes {
		if rid == id {
			delete(s.codes, code)
		}
	}
	return nil
}

// signIn completes authorization request id for the dev user sub.
func (s *devStorage) signIn(id, sub string) error {
	if _, ok := findUser(sub); !ok {
		return fmt.Errorf("unknown dev user %s", identity.QuoteClaim(sub))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expireLocked(time.Now())
	a, ok := s.requests[id]
	if !ok {
		return errors.New("this sign-in has expired or was already used; start again")
	}
	if a.subject != "" {
		return errors.New("this sign-in is already complete")
	}
	a.subject, a.authTime = sub, time.Now()
	return nil
}

// Access tokens of the dev issuer are opaque and only good at its own
// userinfo endpoint; the web UI relies on the ID token.
func (s *devStorage) CreateAccessToken(context.Context, op.TokenRequest) (string, time.Time, error) {
	id, err := randomID()
	if err != nil {
		return "", time.Time{}, err
	}
	return id, time.Now().Add(accessTokenTTL), nil
}

func (s *devStorage) CreateAccessAndRefreshTokens(context.Context, op.TokenRequest, string) (string, string, time.Time, error) {
	return "", "", time.Time{}, oidc.ErrUnsupportedGrantType().WithDescription("refresh tokens are not issued")
}

func (s *devStorage) TokenRequestByRefreshToken(context.Context, string) (op.RefreshTokenRequest, error) {
	return nil, op.ErrInvalidRefreshToken
}

func (s *devStorage) TerminateSession(context.Context, string, string) error { return nil }

func (s *devStorage) RevokeToken(context.Context, string, string, string) *oidc.Error {
	return nil
}

func (s *devStorage) GetRefreshTokenInfo(context.Context, string, string) (string, string, error) {
	return "", "", op.ErrInvalidRefreshToken
}

type devSigningKey struct {
	key *rsa.PrivateKey
	kid string
}

func (k devSigningKey) SignatureAlgorithm() jose.SignatureAlgorithm { return jose.RS256 }
func (k devSigningKey) Key() any                                    { return k.key }
func (k devSigningKey) ID() string                                  { return k.kid }

type devPublicKey struct {
	key *rsa.PublicKey
	kid string
}

func (k devPublicKey) ID() string                         { return k.kid }
func (k devPublicKey) Algorithm() jose.SignatureAlgorithm { return jose.RS256 }
func (k devPublicKey) Use() string                        { return "sig" }
func (k devPublicKey) Key() any                           { return k.key }

func (s *devStorage) SigningKey(context.Context) (op.SigningKey, error) {
	return devSigningKey{key: s.issuer.key, kid: s.issuer.kid}, nil
}

func (s *devStorage) SignatureAlgorithms(context.Context) ([]jose.SignatureAlgorithm, error) {
	return []jose.SignatureAlgorithm{jose.RS256}, nil
}

func (s *devStorage) KeySet(context.Context) ([]op.Key, error) {
	return []op.Key{devPublicKey{key: &s.issuer.key.PublicKey, kid: s.issuer.kid}}, nil
}

func (s *devStorage) GetClientByClientID(_ context.Context, id string) (op.Client, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.clients[id]
	if !ok {
		return nil, notFoundError{"client"}
	}
	return devOPClient{c: c, loginURL: s.issuer.URL() + "/login"}, nil
}

func (s *devStorage) AuthorizeClientIDSecret(_ context.Context, id, secret string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.clients[id]
	if !ok || c.Secret == "" || !constantTimeEqual(c.Secret, secret) {
		return errors.New("invalid client credentials")
	}
	return nil
}

func constantTimeEqual(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	var v byte
	for i := 0; i < len(a); i++ {
		v |= a[i] ^ b[i]
	}
	return v == 0
}

func (s *devStorage) SetUserinfoFromScopes(context.Context, *oidc.UserInfo, string, string, []string) error {
	return nil
}

// SetUserinfoFromRequest puts the operator's claims into the ID token.
func (s *devStorage) SetUserinfoFromRequest(_ context.Context, info *oidc.UserInfo, req op.IDTokenRequest, _ []string) error {
	return setDevClaims(info, req.GetSubject())
}

func (s *devStorage) SetUserinfoFromToken(_ context.Context, info *oidc.UserInfo, _, subject, _ string) error {
	return setDevClaims(info, subject)
}

func setDevClaims(info *oidc.UserInfo, sub string) error {
	u, ok := findUser(sub)
	if !ok {
		return fmt.Errorf("unknown dev user %s", identity.QuoteClaim(sub))
	}
	info.Subject = u.Subject
	info.PreferredUsername = u.Subject
	info.AppendClaims(identity.ClaimKind, string(identity.KindOperator))
	info.AppendClaims(identity.ClaimRole, string(u.Role))
	if u.Team != "" {
		info.AppendClaims(identity.ClaimTeam, u.Team)
	}
	return nil
}

func (s *devStorage) SetIntrospectionFromToken(context.Context, *oidc.IntrospectionResponse, string, string, string) error {
	return errors.New("introspection is not supported")
}

func (s *devStorage) GetPrivateClaimsFromScopes(context.Context, string, string, []string) (map[string]any, error) {
	return nil, nil
}

func (s *devStorage) GetKeyByIDAndClientID(context.Context, string, string) (*jose.JSONWebKey, error) {
	return nil, notFoundError{"key"}
}

func (s *devStorage) ValidateJWTProfileScopes(context.Context, string, []string) ([]string, error) {
	return nil, errors.New("JWT profile grants are not supported")
}

func (s *devStorage) Health(context.Context) error { return nil }

// devOPClient adapts a Client to op.Client: a confidential web client
// using the authorization code flow.
type devOPClient struct {
	c        Client
	loginURL string
}

func (c devOPClient) GetID() string                       { return c.c.ID }
func (c devOPClient) RedirectURIs() []string              { return slices.Clone(c.c.RedirectURIs) }
func (c devOPClient) PostLogoutRedirectURIs() []string    { return nil }
func (c devOPClient) ApplicationType() op.ApplicationType { return op.ApplicationTypeWeb }
func (c devOPClient) AuthMethod() oidc.AuthMethod         { return oidc.AuthMethodBasic }
func (c devOPClient) ResponseTypes() []oidc.ResponseType {
	return []oidc.ResponseType{oidc.ResponseTypeCode}
}
func (c devOPClient) GrantTypes() []oidc.GrantType { return []oidc.GrantType{oidc.GrantTypeCode} }
func (c devOPClient) LoginURL(id string) string {
	return c.loginURL + "?id=" + id
}
func (c devOPClient) AccessTokenType() op.AccessTokenType { return op.AccessTokenTypeBearer }
func (c devOPClient) IDTokenLifetime() time.Duration      { return idTokenTTL }
func (c devOPClient) DevMode() bool                       { return false }
func (c devOPClient) RestrictAdditionalIdTokenScopes() func([]string) []string {
	return func(s []string) []string { return s }
}
func (c devOPClient) RestrictAdditionalAccessTokenScopes() func([]string) []string {
	return func(s []string) []string { return s }
}
func (c devOPClient) IsScopeAllowed(string) bool           { return false }
func (c devOPClient) IDTokenUserinfoClaimsAssertion() bool { return false }
func (c devOPClient) ClockSkew() time.Duration             { return 0 }

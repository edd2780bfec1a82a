package db

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/rds/auth"
	"github.com/jackc/pgx/v5"
)

// IAMTokenLifetime is how long RDS and Aurora accept an IAM database
// authentication token after it was signed (the X-Amz-Expires of the
// presigned request BuildAuthToken makes).
const IAMTokenLifetime = 15 * time.Minute

// DefaultIAMRefresh is how old a cached token may grow before the next
// connection signs a new one: a third of its life left, so a connection
// made just before the refresh (whose handshake may wait out a connect
// timeout or a failover) still presents a token minutes away from expiry.
const DefaultIAMRefresh = 10 * time.Minute

// TokenSigner signs IAM database authentication tokens for one database
// user on one endpoint. The token is the connection's password: never log
// it.
type TokenSigner interface {
	SignToken(ctx context.Context) (string, error)
}

// AWSSigner signs tokens with aws-sdk-go-v2's feature/rds/auth: a SigV4
// presigned rds-db:connect request, computed locally from the credentials
// (only the credentials provider may call AWS, e.g. STS to renew a web
// identity's role session, and the SDK caches those).
type AWSSigner struct {
	// Endpoint is host:port as the clients connect to it.
	Endpoint string
	Region   string
	User     string
	Creds    aws.CredentialsProvider
}

// SignToken builds a fresh token.
func (s AWSSigner) SignToken(ctx context.Context) (string, error) {
	tok, err := auth.BuildAuthToken(ctx, s.Endpoint, s.Region, s.User, s.Creds)
	if err != nil {
		return "", fmt.Errorf("sign IAM token for %s@%s: %w", s.User, s.Endpoint, err)
	}
	return tok, nil
}

// RegionFromHost reads the AWS region out of an RDS endpoint's host name
// (name.cluster-id.REGION.rds.amazonaws.com); "" for any other host.
func RegionFromHost(host string) string {
	labels := strings.Split(strings.TrimSuffix(host, "."), ".")
	for i := len(labels) - 1; i >= 1; i-- {
		if labels[i] == "rds" {
			return labels[i-1]
		}
	}
	return ""
}

// IAMTokens hands out IAM tokens to new connections: one cached token for
// all of them, signed again once it is refresh old, so a pool opening
// many connections at once signs once, and none presents a token past its
// lifetime. Safe for concurrent use.
type IAMTokens struct {
	signer  TokenSigner
	now     func() time.Time
	refresh time.Duration

	mu     sync.Mutex
	token  string
	signed time.Time
}

// NewIAMTokens returns the token cache of signer. now defaults to
// time.Now, refresh to DefaultIAMRefresh; refresh must be below
// IAMTokenLifetime.
func NewIAMTokens(signer TokenSigner, now func() time.Time, refresh time.Duration) (*IAMTokens, error) {
	if signer == nil {
		return nil, errors.New("iam tokens: a signer is required")
	}
	if now == nil {
		now = time.Now
	}
	if refresh == 0 {
		refresh = DefaultIAMRefresh
	}
	if refresh < 0 || refresh >= IAMTokenLifetime {
		return nil, fmt.Errorf("iam tokens: refresh after %s must be above 0 and below the tokens' lifetime (%s)", refresh, IAMTokenLifetime)
	}
	return &IAMTokens{signer: signer, now: now, refresh: refresh}, nil
}

// Token returns the cached token, signing a new one first when it is
// refresh old (or the clock went back past its signing).
func (t *IAMTokens) Token(ctx context.Context) (string, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	if t.token != "" && !now.Before(t.signed) && now.Sub(t.signed) < t.refresh {
		return t.token, nil
	}
	tok, err := t.signer.SignToken(ctx)
	if err != nil {
		return "", &TokenError{Err: err}
	}
	// Stamped before the call would be safer still, but signing is local
	// arithmetic: the token's clock starts within microseconds of now.
	t.token, t.signed = tok, now
	return tok, nil
}

// beforeConnect sets each new connection's password to the current token.
func (t *IAMTokens) beforeConnect(ctx context.Context, cc *pgx.ConnConfig) error {
	tok, err := t.Token(ctx)
	if err != nil {
		return err
	}
	cc.Password = tok
	return nil
}

// TokenError is a failure to sign an IAM token: no credentials, or none
// that can be refreshed. No connection can be made without one, so it
// counts as the database being unavailable (IsUnavailable).
type TokenError struct{ Err error }

func (e *TokenError) Error() string { return "iam database token: " + e.Err.Error() }

func (e *TokenError) Unwrap() error { return e.Err }

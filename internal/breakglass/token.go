package breakglass

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/seal"
)

// Issuer is the "iss" of region's break-glass tokens. It is no URL: no
// OIDC discovery can be pointed at it, and only Authenticator takes it.
func Issuer(region string) string { return "urn:muster:breakglass:" + region }

// PrincipalIssuer is the Issuer of every break-glass principal, so that
// Principal.String names one "breakglass#operator:NAME": no identity
// provider's principal can be named so ('#' never appears in an issuer
// URL, and a home principal's name starts with its kind).
const PrincipalIssuer = "breakglass"

// claims are a break-glass token's claims.
type claims struct {
	Issuer   string `json:"iss"`
	Subject  string `json:"sub"`
	Audience string `json:"aud"`
	Expiry   int64  `json:"exp"`
	IssuedAt int64  `json:"iat"`
	NotUntil int64  `json:"nbf"`
	ID       string `json:"jti"`
	Kind     string `json:"muster_kind"`
	Role     string `json:"muster_role"`
}

// mint signs g's token with signer: a compact JWS (EdDSA) built by hand
// over the Signer interface, so a key held in a KMS signs as the key
// file does.
func mint(ctx context.Context, signer seal.Signer, g Grant, audience string) (string, error) {
	header, err := json.Marshal(map[string]string{"alg": "EdDSA", "typ": "JWT", "kid": signer.KeyID()})
	if err != nil {
		return "", err
	}
	payload, err := json.Marshal(claims{Issuer: Issuer(g.Region), Subject: g.Operator, Audience: audience,
		Expiry: g.ExpiresAt.Unix(), IssuedAt: g.IssuedAt.Unix(), NotUntil: g.IssuedAt.Unix(), ID: g.ID.String(),
		Kind: string(identity.KindOperator), Role: string(g.Role)})
	if err != nil {
		return "", err
	}
	enc := base64.RawURLEncoding
	input := enc.EncodeToString(header) + "." + enc.EncodeToString(payload)
	sig, err := signer.Sign(ctx, []byte(input))
	if err != nil {
		return "", fmt.Errorf("sign break-glass token: %w", err)
	}
	return input + "." + enc.EncodeToString(sig), nil
}

// maxTokenBytes bounds what is decoded before the signature is checked.
const maxTokenBytes = 16 << 10

// unverifiedIssuer reads a compact JWT's "iss" without checking anything:
// only to route the token. "" when it has none or is not a JWT.
func unverifiedIssuer(raw string) string {
	if len(raw) > maxTokenBytes {
		return ""
	}
	parts := strings.Split(raw, ".")
	if len(parts) != 3 {
		return ""
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return ""
	}
	var c struct {
		Issuer string `json:"iss"`
	}
	if json.Unmarshal(b, &c) != nil {
		return ""
	}
	return c.Issuer
}

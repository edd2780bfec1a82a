// Package s3sink keeps audit checkpoints in an S3 bucket with Object Lock
// (the production audit.Sink): every checkpoint is put once, never over an
// existing object (If-None-Match: *), in COMPLIANCE mode with a retention
// date, so that nobody, the bucket's owner and the account's root user
// included, can delete or overwrite it before the retention ends (ADR-15:
// five years). The bucket must have been created with Object Lock enabled
// (which turns versioning on); docs/audit.md lists the IAM permissions.
package s3sink

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
)

// DefaultRetention is how long each checkpoint is locked: five years
// (ADR-15's retention of the audit log).
const DefaultRetention = 5 * 365 * 24 * time.Hour

// Config configures a Sink.
type Config struct {
	// Client is the S3 client (from the SDK's default configuration:
	// AWS_REGION, credentials from the environment or the instance role).
	Client *s3.Client
	Bucket string
	// Prefix is the key prefix checkpoints are kept under, e.g.
	// "muster/prod/" ("" for the bucket's root).
	Prefix string
	// Retention is how long each object is locked (DefaultRetention).
	Retention time.Duration
	// Now is the clock the retention date is counted from (time.Now).
	Now func() time.Time
}

// Sink is an audit.Sink on S3.
type Sink struct{ cfg Config }

// New returns a sink on cfg.Bucket.
func New(cfg Config) (*Sink, error) {
	switch {
	case cfg.Client == nil:
		return nil, errors.New("s3sink: Client is required")
	case cfg.Bucket == "":
		return nil, errors.New("s3sink: Bucket is required")
	case cfg.Retention < 0:
		return nil, errors.New("s3sink: Retention must not be negative")
	}
	if cfg.Retention == 0 {
		cfg.Retention = DefaultRetention
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Prefix != "" && !strings.HasSuffix(cfg.Prefix, "/") {
		cfg.Prefix += "/"
	}
	return &Sink{cfg: cfg}, nil
}

// ParseURL splits s3://bucket/prefix.
func ParseURL(raw string) (bucket, prefix string, err error) {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "s3" || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return "", "", fmt.Errorf("checkpoint sink %q: want s3://bucket/prefix", raw)
	}
	return u.Host, strings.TrimPrefix(u.Path, "/"), nil
}

// Put implements audit.Sink: a PutObject that fails if the key exists,
// locked in COMPLIANCE mode until now + Retention, with a SHA-256 checksum
// (S3 requires an integrity checksum on Object Lock puts).
func (s *Sink) Put(ctx context.Context, name string, data []byte) error {
	_, err := s.cfg.Client.PutObject(ctx, &s3.PutObjectInput{
		Bucket:                    aws.String(s.cfg.Bucket),
		Key:                       aws.String(s.cfg.Prefix + name),
		Body:                      bytes.NewReader(data),
		ContentLength:             aws.Int64(int64(len(data))),
		ContentType:               aws.String("application/json"),
		IfNoneMatch:               aws.String("*"),
		ObjectLockMode:            types.ObjectLockModeCompliance,
		ObjectLockRetainUntilDate: aws.Time(s.cfg.Now().Add(s.cfg.Retention).UTC().Truncate(time.Second)),
		ChecksumAlgorithm:         types.ChecksumAlgorithmSha256,
	})
	if err != nil {
		return fmt.Errorf("put s3://%s/%s%s: %w", s.cfg.Bucket, s.cfg.Prefix, name, err)
	}
	return nil
}

// List implements audit.Sink, paging through ListObjectsV2 from after.
func (s *Sink) List(ctx context.Context, after string) ([]string, error) {
	in := &s3.ListObjectsV2Input{Bucket: aws.String(s.cfg.Bucket), Prefix: aws.String(s.cfg.Prefix)}
	if after != "" {
		in.StartAfter = aws.String(s.cfg.Prefix + after)
	}
	var out []string
	p := s3.NewListObjectsV2Paginator(s.cfg.Client, in)
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("list s3://%s/%s: %w", s.cfg.Bucket, s.cfg.Prefix, err)
		}
		for _, o := range page.Contents {
			name := strings.TrimPrefix(aws.ToString(o.Key), s.cfg.Prefix)
			if strings.HasSuffix(name, ".json") && !strings.Contains(name, "/") && name > after {
				out = append(out, name)
			}
		}
	}
	return out, nil
}

// Get implements audit.Sink.
func (s *Sink) Get(ctx context.Context, name string) ([]byte, error) {
	o, err := s.cfg.Client.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(s.cfg.Bucket), Key: aws.String(s.cfg.Prefix + name)})
	if err != nil {
		return nil, fmt.Errorf("get s3://%s/%s%s: %w", s.cfg.Bucket, s.cfg.Prefix, name, err)
	}
	defer o.Body.Close()
	// A checkpoint is a few hundred bytes; anything much larger is not one.
	b, err := io.ReadAll(io.LimitReader(o.Body, 64<<10))
	if err != nil {
		return nil, fmt.Errorf("get s3://%s/%s%s: %w", s.cfg.Bucket, s.cfg.Prefix, name, err)
	}
	return b, nil
}

func (s *Sink) String() string { return "s3://" + s.cfg.Bucket + "/" + s.cfg.Prefix }

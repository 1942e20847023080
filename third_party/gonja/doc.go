// Package gonja implements a Jinja2-like template engine for Go.
package gonja

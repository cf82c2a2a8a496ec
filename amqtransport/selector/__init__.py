"""JMS message selectors as ActiveMQ 5.17 reads them over STOMP: parse once, evaluate per message.

Theory of operation
-------------------
A SUBSCRIBE's ``selector`` header is an SQL-92 boolean expression over the message's
properties and JMS headers. :func:`compile_selector` parses it once into a tree of
closures (a :class:`Selector`); :meth:`Selector.matches` runs them over one message's
:class:`MessageView`. Pure: no I/O, no clock; one error type, :class:`SelectorError`,
naming the position of the problem.

ActiveMQ 5.17 is the oracle, quirks included. The grammar is its ``SelectorParser.jj``:

- tokens: case-insensitive keywords (``NOT AND OR BETWEEN LIKE ESCAPE IN IS TRUE FALSE
  NULL``; ``XPATH``/``XQUERY`` are refused here), identifiers ``[A-Za-z_$][A-Za-z0-9_$]*``,
  decimal (``L`` suffix allowed), hex, octal and floating literals, ``'strings'`` with
  ``''`` for a quote, ``--`` comments (only when a line end follows) and ``/* */``;
- precedence, loosest first: ``OR``; ``AND``; ``=`` ``<>`` ``IS [NOT] NULL``; ``>``
  ``>=`` ``<`` ``<=`` ``[NOT] LIKE`` ``[NOT] BETWEEN`` ``[NOT] IN``; ``+`` ``-``;
  ``*`` ``/`` ``%``; unary ``+`` ``-`` ``NOT``. ``NOT`` binds tighter than ``=``, so
  ``NOT color = 'blue'`` is ``(NOT color) = 'blue'``;
- checks made while parsing (each a :class:`SelectorError`): ``<``-style operands may
  not be non-numeric literals nor boolean expressions, ``NULL`` cannot be compared with
  ``=``, a boolean literal cannot equal a non-boolean literal, ``IN`` needs a property on
  its left and string literals in its list, ``ESCAPE`` is one character, the whole
  expression and the operands of ``AND``/``OR``/``NOT`` must be boolean (a bare
  property is read as a boolean).

Values are typed as in Java: ``None`` (null), ``bool``, ``str``, ``int`` (an Integer,
32 bits), :class:`JLong` (a Long, 64 bits), ``float`` (a Double) and ``Decimal`` (a
BigDecimal, a literal too large for a Long). Semantics are the filter classes':

- three-valued logic; a message matches when the whole expression is TRUE;
- ``=`` with one null side: null when the left side is null, FALSE when only the right
  is (so ``'x' <> missing`` is TRUE); both null: TRUE;
- comparisons widen Integer -> Long -> Double; incomparable types compare FALSE. STOMP
  selectors are parsed by ActiveMQ with its ``convert_string_expressions`` flag, so a
  string meets a number (or boolean) by converting the string with Java's
  ``Integer/Long/Double/Boolean.valueOf`` (a string that does not convert: FALSE) --
  ``price > 10`` works on a ``price:20`` header, which is a string property;
- arithmetic: Integer and Long wrap, ``/`` and ``%`` are Double; a string on the left of
  ``+`` concatenates; a non-number elsewhere is an *evaluation error*;
- ``LIKE`` (``%``, ``_``, ``ESCAPE``) on a non-string is FALSE; ``IN`` on a non-string
  is null; unary minus on a non-number is null.

An evaluation error (arithmetic on a string, a boolean compared with a string: Java's
RuntimeExceptions) makes :meth:`Selector.matches` False. ActiveMQ instead fails the
topic SEND (the producer gets an ERROR, no subscriber gets the message) or leaves a
queue message undelivered; we do not copy that (docs/brokers/activemq-compat.md).

The STOMP -> JMS mapping (:func:`message_view`) is ActiveMQ's ``FrameTranslator``:
``correlation-id`` -> JMSCorrelationID, ``expires`` -> JMSExpiration, ``timestamp`` ->
JMSTimestamp, ``priority`` -> JMSPriority (default 4), ``type`` -> JMSType,
``reply-to`` -> JMSReplyTo, ``persistent:true`` -> JMSDeliveryMode ``'PERSISTENT'``;
a header named like a JMS header (``JMSPriority``, ``JMSXGroupID``, ...) sets it; the
``AMQ_SCHEDULED_*`` numbers are Long (REPEAT an Integer); every other header is a
*string* property.
"""

from .jms import MessageView, message_view
from .parser import Selector, compile_selector
from .values import JLong, SelectorError

__all__ = ["JLong", "MessageView", "Selector", "SelectorError", "compile_selector", "message_view"]

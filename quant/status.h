/* Status codes and the last-error message shared by every library module.
 * Library code returns a qd_status and sets a message naming the file and the
 * field; only programs and tests print and exit. */
#ifndef QD_STATUS_H
#define QD_STATUS_H

typedef enum {
    QD_OK = 0,
    QD_ERR_NONFINITE, /* NaN or Inf where a finite value is required */
    QD_ERR_SHAPE,     /* dimensions that do not fit (e.g. K not a multiple of 16) */
    QD_ERR_NOMEM,
    QD_ERR_IO,        /* open/read/write/rename failed */
    QD_ERR_FORMAT,    /* malformed input file or message */
    QD_ERR_ARG,       /* bad argument or configuration value */
    QD_ERR_NET,       /* network failure */
    QD_ERR_UNSUPPORTED,
    QD_ERR_DEVICE     /* accelerator error */
} qd_status;

/* Records a printf-style message for the calling thread and returns st. */
qd_status qd_error(qd_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The calling thread's last message ("" if none). Valid until the next qd_error. */
const char *qd_last_error(void);
const char *qd_status_str(qd_status st);

/* The one error idiom of C and CUDA code: return the status of a failing call
 * (its message is already set). */
#define QD_TRY(call)                                                                 \
    do {                                                                             \
        qd_status qd_st_ = (call);                                                   \
        if (qd_st_ != QD_OK)                                                         \
            return qd_st_;                                                           \
    } while (0)

#endif
